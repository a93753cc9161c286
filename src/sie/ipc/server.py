"""The worker's IPC server: framed msgpack over a Unix socket, answering the sidecar's calls from a service object
(contracts Part A §2.1). Owns the socket file (claimed through `sie.ipc.sockets`: a stale socket is replaced, anything
else at the path is a SocketPathError), envelope validation, the exact error strings and response chunking.

A streaming call (ProcessGenerate) answers with several response frames under the call's request_id, one per item
the service yields, written frame by frame so other calls' frames interleave; a failure mid-stream ends it with one
error envelope, and a connection that drops closes the service's iterator (the worker cancels that generation).

It never imports `sie.worker`: the service is any object with the WorkerClient methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from sie.ipc.chunking import DEFAULT_LIMITS, ChunkLimits, chunk_frames, refusal, transfer_digest
from sie.ipc.client import WorkerChild
from sie.ipc.errors import IpcProtocolError
from sie.ipc.framing import read_frame, send_frames
from sie.ipc.methods import METHODS, Method
from sie.ipc.sockets import SocketPathError, claim_socket_path
from sie.wire import DecodeError, packb, structure, unpackb, unstructure
from sie.wire.ipc import DRAIN, IPC_VERSION

logger = logging.getLogger(__name__)

BACKLOG: Final = 1024
SOCKET_MODE: Final = 0o600
# Background calls one connection may have running before the server stops reading its frames.
DEFAULT_MAX_IN_FLIGHT: Final = 256
DRAINING: Final = "draining"


@dataclass(frozen=True, slots=True)
class RequestEnvelope:
    """A request envelope that passed framing; `error` is set when it is answered without dispatch."""

    request_id: str
    method: str = ""
    body: Any = None
    accepts_chunks: bool = False
    error: str | None = None


def parse_envelope(frame: bytes) -> RequestEnvelope:
    """Read a request frame; IpcProtocolError (close the connection) when it is not a msgpack map.

    A missing request_id reads as "" and a missing or null body as {}, as the reference server does.
    """
    try:
        raw = unpackb(frame)
    except DecodeError as exc:
        raise IpcProtocolError(f"malformed msgpack: {exc}") from exc
    if type(raw) is not dict:
        raise IpcProtocolError(f"envelope must be a map, got {type(raw).__name__}")
    request_id = raw.get("request_id", "")
    reply_to = request_id if type(request_id) is str else ""
    version = raw.get("version")
    if type(version) is not int or version != IPC_VERSION:
        return RequestEnvelope(reply_to, error=f"unsupported version {version}")
    method, body = raw.get("method"), raw.get("body")
    body = {} if body is None else body
    if type(method) is not str or type(request_id) is not str or type(body) is not dict:
        return RequestEnvelope(reply_to, error="envelope missing fields")
    # Exactly `true` negotiates chunking; anything else keeps the legacy one-frame contract.
    return RequestEnvelope(request_id, method, body, raw.get("accepts_ipc_response_chunks_v1") is True)


def response_payload(request_id: str, body: Any) -> bytes:
    """A success response envelope, serialized (no `kind` key; bytes stay msgpack bin)."""
    return packb({"version": IPC_VERSION, "request_id": request_id, "ok": True, "body": body, "error": None})


def error_payload(request_id: str, error: str) -> bytes:
    """An error response envelope, serialized."""
    return packb({"version": IPC_VERSION, "request_id": request_id, "ok": False, "body": None, "error": error})


class _Connection:
    """One accepted socket: its writer, the lock that keeps frames whole, and its background calls."""

    def __init__(self, writer: asyncio.StreamWriter, max_in_flight: int) -> None:
        self.writer = writer
        self.write_lock = asyncio.Lock()
        self.slots = asyncio.Semaphore(max_in_flight)
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.slots.release()

    async def cancel_tasks(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class IpcServer:
    """Serve `service` on `socket_path` while the context is open; many connections, many calls in flight on each."""

    def __init__(
        self,
        service: WorkerChild,
        socket_path: Path | str,
        *,
        worker_id: str = "",
        limits: ChunkLimits = DEFAULT_LIMITS,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.service = service
        self.socket_path = Path(socket_path)
        self.worker_id = worker_id
        self.limits = limits
        self.max_in_flight = max_in_flight
        self.draining = False
        self._server: asyncio.Server | None = None
        self._inode: int | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(claim_socket_path, self.socket_path)  # SocketPathError when it is not free
        sock = self._bind()
        self._server = await asyncio.start_unix_server(self._on_connect, sock=sock, backlog=BACKLOG)
        logger.info("IPC server of worker %r listening on %s", self.worker_id, self.socket_path)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.close()  # stop accepting first
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self._remove_socket_file()

    @property
    def connection_count(self) -> int:
        """Connections open now."""
        return len(self._connections)

    # --- the socket file ---------------------------------------------------------------------

    def _bind(self) -> socket.socket:
        path = self.socket_path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
        except OSError as exc:  # taken since it was claimed, or a path too long for a Unix socket
            sock.close()
            raise SocketPathError(f"cannot bind the worker socket {path}: {exc}") from exc
        try:
            # Before listen(): until then nobody can connect, so the socket is never reachable with a wider mode.
            os.chmod(path, SOCKET_MODE)
            self._inode = path.stat().st_ino
        except BaseException:
            sock.close()
            raise
        return sock

    def _remove_socket_file(self) -> None:
        # Only our own file: a newer worker may already have replaced it.
        with contextlib.suppress(FileNotFoundError):
            if self._inode is not None and self.socket_path.stat().st_ino == self._inode:
                self.socket_path.unlink()

    # --- connections ---------------------------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Our own task per connection, so exit can cancel it: asyncio's stream callback (3.11) calls
        # task.exception() on the task it created, which raises if that task itself was cancelled.
        task = asyncio.get_running_loop().create_task(self._serve_connection(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)
        await asyncio.wait({task})

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer, self.max_in_flight)
        try:
            while (frame := await read_frame(reader, self.limits.max_frame_bytes)) is not None:
                await self._on_frame(connection, frame)
        except IpcProtocolError as exc:
            logger.warning("IPC protocol error, closing the connection: %s", exc)
        except OSError as exc:
            logger.info("IPC connection lost: %s", exc)
        except Exception:  # noqa: BLE001 - a bug in one connection must not reach asyncio's callback unlogged
            logger.exception("IPC connection failed")
        finally:
            await connection.cancel_tasks()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _on_frame(self, connection: _Connection, frame: bytes) -> None:
        envelope = parse_envelope(frame)
        method = METHODS.get(envelope.method)
        error = envelope.error or self._refusal(envelope.method, method)
        if error is not None or method is None:
            await self._send(connection, envelope, error_payload(envelope.request_id, error or ""))
        elif method.background:
            await connection.slots.acquire()  # a full connection stops being read: backpressure on the client
            answer = self._stream if method.streaming else self._answer_in_background
            connection.spawn(answer(connection, envelope, method))
        else:
            await self._send(connection, envelope, await self._call(envelope, method))

    def _refusal(self, name: str, method: Method | None) -> str | None:
        """The error a well-formed envelope gets without a call: an unknown method, or a batch while draining."""
        if method is None:
            return f"unknown method {name}"
        if method.background and self.draining:
            return DRAINING
        return None

    async def _answer_in_background(self, connection: _Connection, envelope: RequestEnvelope, method: Method) -> None:
        payload = await self._call(envelope, method)
        try:
            await self._send(connection, envelope, payload)
        except OSError as exc:
            logger.info("IPC peer left before the answer to %s %s: %s", envelope.method, envelope.request_id, exc)

    async def _stream(self, connection: _Connection, envelope: RequestEnvelope, method: Method) -> None:
        """Answer a streaming call: one frame per item; the iterator is closed however the stream ends."""
        try:
            request = structure(envelope.body, method.request_type)
        except DecodeError as exc:
            payload = error_payload(envelope.request_id, f"bad body for {envelope.method}: {exc}")
            with contextlib.suppress(OSError):
                await self._send(connection, envelope, payload)
            return
        items: AsyncIterator[Any] | None = None
        try:
            items = method.call(self.service, request)
            async for item in items:
                try:
                    await self._send(connection, envelope, response_payload(envelope.request_id, unstructure(item)))
                except OSError as exc:
                    logger.info("IPC peer left during the stream of %s %s: %s", envelope.method, envelope.request_id,
                                exc)  # fmt: skip
                    return
        except Exception as exc:  # noqa: BLE001 - a failed stream ends with one "{ExcType}: {msg}" error frame
            logger.exception("IPC stream %s %s failed", envelope.method, envelope.request_id)
            payload = error_payload(envelope.request_id, f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(OSError):
                await self._send(connection, envelope, payload)
        finally:
            # Ended early (peer gone, connection or server closing): closing the iterator stops the work behind it.
            await _aclose(items, envelope)

    async def _call(self, envelope: RequestEnvelope, method: Method) -> bytes:
        """The serialized answer to one call; a handler failure becomes an error response, never a crash."""
        try:
            request = structure(envelope.body, method.request_type)
        except DecodeError as exc:
            return error_payload(envelope.request_id, f"bad body for {envelope.method}: {exc}")
        try:
            response = await method.call(self.service, request)
            if envelope.method == DRAIN:
                self.draining = True
            return response_payload(envelope.request_id, unstructure(response))
        except Exception as exc:  # noqa: BLE001 - every handler failure is answered "{ExcType}: {msg}"
            logger.exception("IPC method %s failed", envelope.method)
            return error_payload(envelope.request_id, f"{type(exc).__name__}: {exc}")

    async def _send(self, connection: _Connection, envelope: RequestEnvelope, payload: bytes) -> None:
        """Write one response: one frame, or v1 chunks when it is over the frame limit and the caller accepts them."""
        frames: Iterable[bytes] = (payload,)
        if len(payload) > self.limits.max_frame_bytes:
            reason = refusal(envelope.request_id, len(payload), envelope.accepts_chunks, self.limits)
            if reason is not None:
                logger.warning("IPC response to %s of %d bytes refused: %s", envelope.method, len(payload), reason)
                frames = (error_payload(envelope.request_id, reason),)
            else:
                digest = await asyncio.to_thread(transfer_digest, payload)
                frames = chunk_frames(envelope.request_id, payload, digest, self.limits)
        async with connection.write_lock:
            await send_frames(connection.writer, frames)


async def _aclose(items: AsyncIterator[Any] | None, envelope: RequestEnvelope) -> None:
    """Close a streaming call's iterator (a no-op once it has ended); a failure to close is logged, not raised."""
    aclose = getattr(items, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # noqa: BLE001 - the stream is over either way; its task must not end with an unread error
        logger.exception("closing the IPC stream %s %s failed", envelope.method, envelope.request_id)
