"""Where a pod's worker children listen: one worker on `SIE_IPC_SOCKET_PATH` itself, several on
`{SIE_IPC_SOCKET_PATH}.{i}` (i = 0, 1, …). The worker supervisor names them so, the sidecar finds them so.

A socket file whose server is gone (a worker killed without its clean exit) refuses connections; a worker
starting in the other layout removes such leftovers, so the sidecar never finds a dead layout beside the live one.

`claim_socket_path` readies a path for a worker to bind: its directory exists (created mode 0700) and belongs to
this user or root, a stale socket there is removed, and anything else there (a socket another process listens on,
a regular file, a directory, a link) is a SocketPathError naming the path, for the role to print.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

_CHILD_SUFFIX = re.compile(r"\.(\d+)")
DIRECTORY_MODE: Final = 0o700
ROOT_UID: Final = 0
# How long probing a socket for a listener may take; a listener answers (or refuses) at once.
PROBE_TIMEOUT_S: Final = 1.0


class SocketPathError(Exception):
    """A worker socket path that cannot be served; the message names the path and what to do."""


def child_socket_path(base: Path, index: int) -> Path:
    """The socket of child `index` of the worker whose socket path is `base`."""
    return Path(f"{base}.{index}")


def child_socket_paths(base: Path) -> dict[int, Path]:
    """The child sockets present next to `base`, by child index, in index order."""
    base = Path(base)
    found: dict[int, Path] = {}
    if base.parent.is_dir():
        for entry in base.parent.iterdir():
            if not entry.name.startswith(base.name):
                continue
            match = _CHILD_SUFFIX.fullmatch(entry.name[len(base.name) :])
            if match:
                found[int(match.group(1))] = entry
    return dict(sorted(found.items()))


def remove_stale_sockets(paths: Iterable[Path]) -> list[Path]:
    """Remove each socket file nobody serves (its connection is refused); returns what was removed."""
    removed = []
    for path in paths:
        if not path.is_socket() or _served(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
            logger.info("removed the stale worker socket %s", path)
    return removed


def claim_socket_path(path: Path) -> None:
    """Make `path` free for a worker to bind (blocking: at most one connect attempt); SocketPathError when it
    cannot be."""
    _prepare_directory(path.parent)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(
            f"{path} exists and is {_kind(mode)}, not a socket; remove it or set SIE_IPC_SOCKET_PATH elsewhere"
        )
    if _served(path):
        raise SocketPathError(
            f"another process is listening on {path} (a worker already running?); stop it or set "
            "SIE_IPC_SOCKET_PATH elsewhere"
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        logger.info("removed the stale worker socket %s", path)


def _prepare_directory(directory: Path) -> None:
    """Create `directory` (mode 0700) when missing; SocketPathError unless it is a directory that this user or
    root owns, and, when it is a link, a link one of them made."""
    try:
        directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        entries = (os.lstat(directory), os.stat(directory))
    except OSError as exc:
        raise SocketPathError(f"cannot create the worker socket directory {directory}: {exc.strerror}") from exc
    if not stat.S_ISDIR(entries[1].st_mode):
        raise SocketPathError(f"{directory} is not a directory; set SIE_IPC_SOCKET_PATH to a path in one")
    for entry in entries:
        if entry.st_uid not in (os.getuid(), ROOT_UID):
            raise SocketPathError(
                f"the worker socket directory {directory} belongs to uid {entry.st_uid}, not to this user "
                f"(uid {os.getuid()}): another user could replace the socket; set SIE_IPC_SOCKET_PATH elsewhere"
            )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def _served(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
