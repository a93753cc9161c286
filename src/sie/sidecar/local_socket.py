"""The local-ingest socket's I/O pieces (seed 001 "Local Ingest"): the socket file, claimed and bound owner-only
(mode 0600) and removed only while it is still ours, and the bounded writer of one connection's frames. What the
frames mean is `sie.sidecar.local_ingest`'s and `sie.sidecar.local_protocol`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from pathlib import Path
from typing import Final

from sie.ipc.sockets import SocketPathError

logger = logging.getLogger(__name__)

SOCKET_MODE: Final = 0o600
DIRECTORY_MODE: Final = 0o700
PROBE_TIMEOUT_S: Final = 1.0
WRITE_TIMEOUT_S: Final = 10.0
# How long closing a connection waits for its queued frames to go out.
CLOSE_FLUSH_S: Final = 1.0


def claim_socket_path(path: Path) -> None:
    """Make `path` free to bind (blocking: at most one connect attempt): its directory exists (created 0700), a
    stale socket there is removed; SocketPathError for anything else there, or a socket somebody listens on."""
    try:
        path.parent.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SocketPathError(f"cannot use the local-ingest socket path {path}: {exc.strerror}") from exc
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket; remove it or set SIE_LOCAL_INGEST_SOCKET elsewhere")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(PROBE_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink(missing_ok=True)  # nobody listens: a stale socket of a sidecar that did not exit cleanly
            logger.info("removed the stale local-ingest socket %s", path)
            return
    raise SocketPathError(f"another process listens on {path}; stop it or set SIE_LOCAL_INGEST_SOCKET elsewhere")


def bind_owner_only(path: Path) -> tuple[socket.socket, int]:
    """A socket bound at `path` with mode 0600, not yet listening; and the socket file's inode."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        # Before listen(): until then every connect is refused, so the socket is never reachable with a wider mode.
        # Not a umask: it is process-wide, and a directory another thread made meanwhile would lose its x bits.
        os.chmod(path, SOCKET_MODE)
        inode = path.stat().st_ino
    except OSError as exc:
        sock.close()
        raise SocketPathError(f"cannot bind the local-ingest socket {path}: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    return sock, inode


def remove_socket_file(path: Path, inode: int | None) -> None:
    """Remove the socket file if it is still the one bound as `inode` (another sidecar may have replaced it)."""
    with contextlib.suppress(FileNotFoundError):
        if inode is not None and path.stat().st_ino == inode:
            path.unlink()


class FrameWriter:
    """The writer of one connection's frames: at most `max_frames` frames and `max_bytes` bytes queued, each write
    done within `write_timeout_s`. A client that lets its frames pile up past either bound, or reads nothing for
    that long, is disconnected (`slow`), so a slow reader never grows the sidecar's memory."""

    def __init__(
        self, writer: asyncio.StreamWriter, max_frames: int, max_bytes: int, write_timeout_s: float = WRITE_TIMEOUT_S
    ) -> None:
        self._writer = writer
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(max_frames)
        self._queued_bytes = 0
        self._max_bytes = max_bytes
        self._write_timeout_s = write_timeout_s
        self.open = True  # false once closing: nothing more is queued
        self.slow = False
        self._aborted = False
        self._writing = asyncio.get_running_loop().create_task(self._write_loop())

    def send(self, frame: bytes) -> None:
        """Queue one frame (dropped once closing); past the bounds the connection is aborted."""
        if not self.open:
            return
        if self._queue.full() or self._queued_bytes + len(frame) > self._max_bytes:
            logger.warning("a local-ingest client does not read its results; disconnecting it")
            self.abort(slow=True)
            return
        self._queued_bytes += len(frame)
        self._queue.put_nowait(frame)

    def abort(self, *, slow: bool = False) -> None:
        """Close at once, dropping what is queued: the reader then sees the end of the stream."""
        self.open = False
        self.slow = self.slow or slow
        self._aborted = True
        self._writer.transport.abort()

    async def close(self) -> None:
        """Let the queued frames go out (for at most CLOSE_FLUSH_S), then close."""
        self.open = False
        try:
            if not self._aborted and not self._writing.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_FLUSH_S):
                        await self._queue.join()
        finally:  # cancelled meanwhile (the ingest leaving): the socket is closed all the same
            self._writing.cancel()
            try:
                await asyncio.gather(self._writing, return_exceptions=True)
            finally:
                await close_writer(self._writer)

    async def _write_loop(self) -> None:
        while True:
            frame = await self._queue.get()
            self._queued_bytes -= len(frame)
            try:
                self._writer.write(frame)
                async with asyncio.timeout(self._write_timeout_s):
                    await self._writer.drain()
            except TimeoutError:
                logger.warning("a local-ingest client read nothing for %.0f s; disconnecting it", self._write_timeout_s)
                self.abort(slow=True)
                return
            except OSError:  # the client left; the reader sees it too
                self.abort()
                return
            finally:
                self._queue.task_done()


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a connection, letting what was written go out for at most CLOSE_FLUSH_S."""
    try:
        async with asyncio.timeout(CLOSE_FLUSH_S):
            await writer.drain()
    except (OSError, TimeoutError):
        writer.transport.abort()
    except BaseException:  # cancelled: nothing more goes out
        writer.transport.abort()
        raise
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


__all__ = ["FrameWriter", "bind_owner_only", "claim_socket_path", "close_writer", "remove_socket_file"]
