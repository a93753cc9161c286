"""Where a pod's worker children listen: one worker on `SIE_IPC_SOCKET_PATH` itself, several on
`{SIE_IPC_SOCKET_PATH}.{i}` (i = 0, 1, …). The worker supervisor names them so, the sidecar finds them so.

A socket file whose server is gone (a worker killed without its clean exit) refuses connections; a worker
starting in the other layout removes such leftovers, so the sidecar never finds a dead layout beside the live one.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

_CHILD_SUFFIX = re.compile(r"\.(\d+)")


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


def _served(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
