"""The sidecar's side of the IPC: a WorkerClient over one Unix-socket connection, multiplexed by request_id.

Every request negotiates response chunking v1; chunks are verified (identity, layout, order, length, SHA-256)
before the response is decoded. A dropped connection fails the calls waiting on it; the next call reconnects.

ProcessGenerate streams: its frames (GenerateEvents, small, never chunked) queue on a stream entry until the caller
reads them. A caller that stops reading before `done` (or gives up after the idle limit) drops the entry, so later
frames are discarded, and asks the worker to cancel the generation (SignalGenerateCancel by its request id).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from sie.ipc.chunking import DEFAULT_LIMITS, ChunkAssembler, ChunkBudget, ChunkBudgetError, ChunkLimits
from sie.ipc.errors import IpcConnectionError, IpcError, IpcProtocolError, IpcRemoteError, IpcTimeoutError
from sie.ipc.framing import read_frame, send_frames
from sie.telemetry.sidecar import IpcChunks, IpcDirection, SidecarMetrics
from sie.wire import DecodeError, packb, structure, unpackb, unstructure
from sie.wire import ipc as methods
from sie.wire.generate import EVENT_DONE, GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc import IPC_RESPONSE_CHUNK_KIND, IPC_VERSION, IpcResponseChunkV1
from sie.wire.ipc_batch import BatchOutcome, RunBatchRequest
from sie.wire.ipc_control import (
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelControlStatusRequest,
    ModelControlStatusResponse,
    PingRequest,
    PingResponse,
    ReplaceModelConfigsRequest,
    ReplaceModelConfigsResponse,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
    UnloadModelRequest,
    UnloadModelResponse,
    WorkerCapabilitiesRequest,
    WorkerCapabilitiesResponse,
    WorkerMetricsRequest,
    WorkerMetricsResponse,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S: Final = 60.0
# A generation's frames come at token pace; a stream silent this long is given up (and cancelled).
DEFAULT_STREAM_IDLE_S: Final = 120.0
# The cancel sent for a stream the caller abandoned gets at most this long (it runs on the caller's way out).
_ABANDON_CANCEL_S: Final = 5.0


class _Pending:
    """One call waiting for its answer: a decoded legacy envelope (dict) or verified chunked bytes."""

    __slots__ = ("assembler", "future")

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future
        self.assembler: ChunkAssembler | None = None

    def fail(self, exc: IpcError) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def close(self) -> None:
        if self.assembler is not None:
            self.assembler.close()


class _Stream:
    """One streaming call: its response envelopes, then the failure that ended it (if any), in arrival order.

    Unbounded: frames of many calls share the socket, so one slow reader cannot be pushed back on alone; a
    generation's frames are small and come at token pace.
    """

    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any] | IpcError] = asyncio.Queue()

    def push(self, envelope: dict[str, Any]) -> None:
        self.queue.put_nowait(envelope)

    def fail(self, exc: IpcError) -> None:
        self.queue.put_nowait(exc)


class _Connection:
    """One socket: a reader task routing answers by request_id, a write lock keeping request frames whole."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        limits: ChunkLimits,
        budget: ChunkBudget,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.limits = limits
        self.budget = budget
        self.metrics = metrics
        self.pending: dict[str, _Pending] = {}
        self.streams: dict[str, _Stream] = {}
        self.write_lock = asyncio.Lock()
        self.closed = False
        self.reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    def register(self, request_id: str) -> _Pending:
        entry = _Pending(asyncio.get_running_loop().create_future())
        self.pending[request_id] = entry
        return entry

    def unregister(self, request_id: str) -> None:
        entry = self.pending.pop(request_id, None)
        if entry is not None:
            entry.close()

    def open_stream(self, request_id: str) -> _Stream:
        stream = self.streams[request_id] = _Stream()
        return stream

    def close_stream(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    async def send(self, payload: bytes) -> None:
        if self.closed:
            raise IpcConnectionError("IPC connection closed before the request was sent")
        try:
            async with self.write_lock:
                await send_frames(self.writer, (payload,))
            if self.metrics is not None:
                self.metrics.ipc_bytes(IpcDirection.SENT, len(payload))
        except OSError as exc:
            self._shut(f"IPC connection lost while sending: {exc}")
            raise IpcConnectionError(f"IPC connection lost while sending: {exc}") from exc

    async def aclose(self, reason: str) -> None:
        self.reader_task.cancel()
        await asyncio.gather(self.reader_task, return_exceptions=True)
        self._shut(reason)

    async def _read_loop(self) -> None:
        reason = "the worker closed the IPC connection"
        try:
            while (frame := await read_frame(self.reader, self.limits.max_read_bytes)) is not None:
                if self.metrics is not None:
                    self.metrics.ipc_bytes(IpcDirection.RECEIVED, len(frame))
                self._route(frame)
        except IpcProtocolError as exc:
            reason = f"IPC protocol error, connection closed: {exc}"
            logger.warning(reason)
        except OSError as exc:
            reason = f"IPC connection lost: {exc}"
        finally:
            self._shut(reason)

    def _shut(self, reason: str) -> None:
        """Close the socket and fail every call still waiting on it."""
        self.closed = True
        self.writer.close()
        for entry in self.pending.values():
            entry.fail(IpcConnectionError(reason))
        for stream in self.streams.values():
            stream.fail(IpcConnectionError(reason))

    def _route(self, frame: bytes) -> None:
        try:
            raw = unpackb(frame)
        except DecodeError as exc:
            raise IpcProtocolError(f"malformed IPC response: {exc}") from exc
        if type(raw) is not dict:
            raise IpcProtocolError(f"IPC response must be a map, got {type(raw).__name__}")
        request_id = raw.get("request_id")
        entry = self.pending.get(request_id) if type(request_id) is str else None
        stream = self.streams.get(request_id) if entry is None and type(request_id) is str else None
        if stream is not None:
            stream.push(raw)
        elif entry is None or entry.future.done():
            # A late answer to a call that timed out, a frame of an abandoned stream, or the rest of a transfer
            # that already failed.
            logger.debug("dropping an IPC frame for request %r that nobody waits for", request_id)
        elif raw.get("kind") == IPC_RESPONSE_CHUNK_KIND:
            self._on_chunk(entry, raw, len(frame))
        elif entry.assembler is not None and entry.assembler.in_progress:
            entry.fail(IpcProtocolError("IPC response changed from chunked to legacy mid-transfer"))
        else:
            entry.future.set_result(raw)

    def _on_chunk(self, entry: _Pending, raw: dict[str, Any], frame_bytes: int) -> None:
        try:
            chunk = structure(raw, IpcResponseChunkV1)
            if entry.assembler is None:
                entry.assembler = ChunkAssembler(raw["request_id"], self.limits, self.budget)
            data = entry.assembler.push(chunk, frame_bytes)
        except DecodeError as exc:
            self._chunks_ended(IpcChunks.PROTOCOL_ERROR)
            entry.fail(IpcProtocolError(f"malformed IPC response chunk v1: {exc}"))
        except IpcProtocolError as exc:
            budget = isinstance(exc, ChunkBudgetError)
            self._chunks_ended(IpcChunks.BUDGET_REJECTED if budget else IpcChunks.PROTOCOL_ERROR)
            entry.fail(exc)
        else:
            if data is not None:
                self._chunks_ended(IpcChunks.COMPLETED)
                entry.future.set_result(data)

    def _chunks_ended(self, outcome: IpcChunks) -> None:
        if self.metrics is not None:
            self.metrics.ipc_chunks(outcome)


def _decode_answer(answer: Any, request_id: str) -> dict[str, Any]:
    """The response envelope of one call; reassembled chunks must hold the envelope of that very call."""
    if isinstance(answer, dict):
        return answer
    try:
        envelope = unpackb(answer)
    except DecodeError as exc:
        raise IpcProtocolError(f"reassembled IPC response is not msgpack: {exc}") from exc
    if type(envelope) is not dict or envelope.get("request_id") != request_id or envelope.get("version") != IPC_VERSION:
        raise IpcProtocolError(f"reassembled IPC response is not the response envelope of {request_id!r}")
    return envelope


def _response_body(envelope: dict[str, Any], method: str, response_type: type[T]) -> T:
    ok = envelope.get("ok")
    if ok is False:
        error = envelope.get("error")
        raise IpcRemoteError(error if isinstance(error, str) else f"{method} failed without an error message")
    if ok is not True:
        raise IpcProtocolError(f"IPC response to {method} has no boolean `ok`")
    try:
        return structure(envelope.get("body"), response_type)
    except DecodeError as exc:
        raise IpcProtocolError(f"bad response body for {method}: {exc}") from exc


class UdsWorkerClient:
    """A WorkerClient that calls a worker's IpcServer at `socket_path`; connects on first use.

    `timeout_s` bounds each call (connect, send and answer); a timed-out call leaves the connection open.
    A stream (ProcessGenerate) has no overall bound: it fails once no frame came for `stream_idle_s`.
    Share one ChunkBudget across all clients of a process so their reassemblies stay within one memory bound.
    `metrics` (when given) counts frame bytes and chunked responses.
    """

    def __init__(
        self,
        socket_path: Path | str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        stream_idle_s: float = DEFAULT_STREAM_IDLE_S,
        limits: ChunkLimits = DEFAULT_LIMITS,
        budget: ChunkBudget | None = None,
        metrics: SidecarMetrics | None = None,
    ) -> None:
        self.socket_path = Path(socket_path)
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.stream_idle_s = stream_idle_s
        self.limits = limits
        self.budget = budget if budget is not None else ChunkBudget(limits.reservation_limit_bytes)
        self._ids = itertools.count(1)
        self._connection: _Connection | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        self._connect_lock = asyncio.Lock()
        self._closed = False
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        if self._connection is not None:
            await self._connection.aclose("the IPC client was closed")
            self._connection = None

    # --- the WorkerClient methods ------------------------------------------------------------

    async def ping(self, request: PingRequest) -> PingResponse:
        return await self.call(methods.PING, request, PingResponse)

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        return await self.call(methods.ENSURE_MODEL_READY, request, EnsureModelReadyResponse)

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        return await self.call(methods.RUN_BATCH, request, BatchOutcome)

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        """The generation's events as the worker sends them, ending after `done`.

        IpcRemoteError when the worker ends the stream with an error, IpcConnectionError when the connection
        drops, IpcTimeoutError after `stream_idle_s` without a frame. Leaving early cancels the generation.
        """
        method = methods.PROCESS_GENERATE
        request_id = f"ipc-{next(self._ids)}"
        payload = self._request_payload(method, request_id, request, accepts_chunks=False)
        connection, stream = await self._open_stream(method, request_id, payload)
        ended = False  # the worker's stream is over: `done`, an error frame or a lost connection
        try:
            while not ended:
                frame = await self._next_frame(stream, method)
                if isinstance(frame, IpcError):  # the connection dropped: the worker closes its side itself
                    ended = True
                    raise frame
                ended = frame.get("ok") is False  # an error frame is the worker's last
                event = _response_body(frame, method, GenerateEvent)
                ended = event.kind == EVENT_DONE
                yield event
        finally:
            connection.close_stream(request_id)
            if not ended:
                await self._cancel_abandoned(connection, request)

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        return await self.call(methods.SIGNAL_GENERATE_CANCEL, request, SignalGenerateCancelResponse)

    async def worker_capabilities(self, request: WorkerCapabilitiesRequest) -> WorkerCapabilitiesResponse:
        return await self.call(methods.WORKER_CAPABILITIES, request, WorkerCapabilitiesResponse)

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        return await self.call(methods.APPLY_MODEL_CONFIG, request, ApplyModelConfigResponse)

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        return await self.call(methods.REPLACE_MODEL_CONFIGS, request, ReplaceModelConfigsResponse)

    async def drain(self, request: DrainRequest) -> DrainResponse:
        return await self.call(methods.DRAIN, request, DrainResponse)

    async def model_control_status(self, request: ModelControlStatusRequest) -> ModelControlStatusResponse:
        return await self.call(methods.MODEL_CONTROL_STATUS, request, ModelControlStatusResponse)

    async def worker_metrics(self, request: WorkerMetricsRequest) -> WorkerMetricsResponse:
        return await self.call(methods.WORKER_METRICS, request, WorkerMetricsResponse)

    async def unload_model(self, request: UnloadModelRequest) -> UnloadModelResponse:
        return await self.call(methods.UNLOAD_MODEL, request, UnloadModelResponse)

    # --- the call ------------------------------------------------------------------------------

    async def call(self, method: str, request: Any, response_type: type[T], *, timeout_s: float | None = None) -> T:
        """Send `request` as `method` and decode the answer's body as `response_type`; IpcError on any failure."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        request_id = f"ipc-{next(self._ids)}"
        payload = self._request_payload(method, request_id, request)
        try:
            async with asyncio.timeout(timeout):
                connection = await self._connect()
                entry = connection.register(request_id)
                try:
                    await connection.send(payload)
                    envelope = _decode_answer(await entry.future, request_id)
                    return _response_body(envelope, method, response_type)
                finally:
                    connection.unregister(request_id)  # after decoding: a chunk reservation covers it
        except TimeoutError as exc:
            raise IpcTimeoutError(f"{method} got no answer from the worker within {timeout:g} s") from exc

    def _request_payload(self, method: str, request_id: str, request: Any, *, accepts_chunks: bool = True) -> bytes:
        envelope = {"version": IPC_VERSION, "request_id": request_id, "method": method, "body": unstructure(request)}
        if accepts_chunks:
            envelope["accepts_ipc_response_chunks_v1"] = True
        payload = packb(envelope)
        if len(payload) > self.limits.max_frame_bytes:
            raise IpcProtocolError(f"{method} request of {len(payload)} bytes is over the IPC frame limit")
        return payload

    # --- streams -------------------------------------------------------------------------------------

    async def _open_stream(self, method: str, request_id: str, payload: bytes) -> tuple[_Connection, _Stream]:
        """Register the stream's entry and send its request, within `timeout_s`."""
        connection: _Connection | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                connection = await self._connect()
                stream = connection.open_stream(request_id)
                await connection.send(payload)
        except BaseException as exc:
            if connection is not None:
                connection.close_stream(request_id)
            if isinstance(exc, TimeoutError):
                raise IpcTimeoutError(f"{method} could not be sent within {self.timeout_s:g} s") from exc
            raise
        return connection, stream

    async def _next_frame(self, stream: _Stream, method: str) -> dict[str, Any] | IpcError:
        """The stream's next envelope or the failure that ended it; IpcTimeoutError after `stream_idle_s`."""
        try:
            async with asyncio.timeout(self.stream_idle_s):
                return await stream.queue.get()
        except TimeoutError as exc:
            raise IpcTimeoutError(f"{method} sent nothing for {self.stream_idle_s:g} s") from exc

    async def _cancel_abandoned(self, connection: _Connection, request: ProcessGenerateRequest) -> None:
        """Ask the worker to stop a generation nobody reads any more (best effort: its frames are dropped anyway)."""
        generation_id = _generation_id(request)
        if connection.closed or generation_id is None:
            return  # a closed connection already closed the worker's side of the stream
        cancel = SignalGenerateCancelRequest(request_id=generation_id)
        try:
            await self.call(methods.SIGNAL_GENERATE_CANCEL, cancel, SignalGenerateCancelResponse,
                            timeout_s=min(self.timeout_s, _ABANDON_CANCEL_S))  # fmt: skip
        except IpcError as exc:
            logger.info("cancelling the abandoned generation %s failed: %s", generation_id, exc)

    async def _connect(self) -> _Connection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        if self._connect_lock is None or self._closed:
            raise IpcConnectionError("the IPC client is not open: use it as `async with UdsWorkerClient(...)`")
        async with self._connect_lock:
            if self._connection is None or self._connection.closed:
                try:
                    reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
                except OSError as exc:
                    raise IpcConnectionError(f"cannot connect to the worker at {self.socket_path}: {exc}") from exc
                self._connection = _Connection(reader, writer, self.limits, self.budget, self.metrics)
        return self._connection


def _generation_id(request: ProcessGenerateRequest) -> str | None:
    """The request id of the work item a ProcessGenerate carries (what SignalGenerateCancel names), if readable."""
    try:
        item = unpackb(request.work_item_msgpack)
    except DecodeError:
        return None
    request_id = item.get("request_id") if type(item) is dict else None
    return request_id if type(request_id) is str and request_id else None
