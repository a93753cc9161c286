"""Where a pod's worker children are: the in-process ones of `--role all`, or the worker processes of a pod
answering on Unix sockets `{SIE_IPC_SOCKET_PATH}.{i}` (or `{SIE_IPC_SOCKET_PATH}` alone for one worker).

The fleet asks `discover()` every probe round, so children that appear later (a worker pod starting after its
sidecar) or restart are picked up without a restart of the sidecar; `reconnect(name)` drops a connection that
hung and dials again on next use.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from sie.ipc.client import WorkerChild
from sie.ipc.sockets import child_socket_paths
from sie.ipc.uds_client import UdsWorkerClient

logger = logging.getLogger(__name__)


def child_name(index: int) -> str:
    """The stable name of the child with this index (its socket suffix, or its device slot in-process)."""
    return f"worker-{index}"


class ChildDirectory(Protocol):
    """The worker children present now, each as a WorkerChild, by stable name."""

    async def discover(self) -> Mapping[str, WorkerChild]: ...

    async def reconnect(self, name: str) -> None: ...

    async def aclose(self) -> None: ...


class LocalChildren:
    """A fixed set of in-process children (`--role all`): their services are called directly."""

    def __init__(self, children: Mapping[str, WorkerChild]) -> None:
        self._children = dict(children)

    async def discover(self) -> Mapping[str, WorkerChild]:
        return self._children

    async def reconnect(self, name: str) -> None:
        """An in-process call cannot hang on a connection: nothing to redial."""

    async def aclose(self) -> None:
        """The services belong to the role that built them."""


def socket_children(base: Path) -> dict[str, Path]:
    """The child sockets next to `base`: `{base}.{i}` when any exist, else `base` itself when it exists."""
    found = {child_name(index): path for index, path in child_socket_paths(base).items()}
    if not found and base.exists():
        found[child_name(0)] = base
    return found


class SocketChildren:
    """Worker processes of this pod, one Unix socket each; a client is opened per socket found and closed
    when its socket disappears."""

    def __init__(self, base: Path, connect: Callable[[Path], UdsWorkerClient] = UdsWorkerClient) -> None:
        self.base = Path(base)
        self._connect = connect
        self._clients: dict[str, tuple[Path, UdsWorkerClient]] = {}

    async def discover(self) -> Mapping[str, WorkerChild]:
        present = await asyncio.to_thread(socket_children, self.base)  # a directory listing: off the loop
        for name in [name for name, (path, _) in self._clients.items() if present.get(name) != path]:
            await self._close(name)
        for name, path in present.items():
            if name not in self._clients:
                client = self._connect(path)
                await client.__aenter__()
                self._clients[name] = (path, client)
                logger.info("worker child %s found at %s", name, path)
        return {name: client for name, (_, client) in self._clients.items()}

    async def reconnect(self, name: str) -> None:
        entry = self._clients.get(name)
        if entry is None:
            return
        await self._close(name)
        client = self._connect(entry[0])
        await client.__aenter__()
        self._clients[name] = (entry[0], client)
        logger.warning("worker child %s did not answer its probe in time; its connection was recreated", name)

    async def aclose(self) -> None:
        for name in list(self._clients):
            await self._close(name)

    async def _close(self, name: str) -> None:
        _, client = self._clients.pop(name)
        await client.__aexit__(None, None, None)
