"""HTTP of text generation: `POST /v1/generate/{model:path}` (SIE-native), `POST /v1/chat/completions` and
`POST /v1/completions` (OpenAI), each buffered or, with `stream: true`, as server-sent events (seed 000 §2).

The handler waits for the first chunk before it answers, so every failure up to then is an HTTP error in the
OpenAI envelope; once events flow, a failure is one terminal event carrying `error` and then `data: [DONE]`. Each
surface's shape (native, chat, completion) renders the chunks; replies.py maps failures.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Protocol

import anyio
import attrs
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sie.gateway.dispatch import Streamed
from sie.gateway.generation import GenerateCall, GenerationService
from sie.gateway.http import generation_requests
from sie.gateway.http.edge import endpoint, incoming_trace, lane_hints, until_disconnect
from sie.gateway.http.headers import REQUEST_ID, TRACE_ID, VERSION_HEADERS, response_headers
from sie.gateway.http.negotiation import JSON_MEDIA_TYPE, decode_data
from sie.gateway.http.replies import Surface, stream_error
from sie.gateway.metadata import ResponseMetadata
from sie.http.bodies import read_body
from sie.telemetry.tracing import (
    GATEWAY_PROXY_CHAT,
    GATEWAY_PROXY_GENERATE,
    INVALID_SPAN,
    SERVER_SPAN,
    Span,
    TraceHeaders,
    Tracing,
    mark_failed,
    trace_id_of,
)
from sie.wire import dumps_json
from sie.wire.generate import GenerateChunk, GenerationUsage

EVENT_STREAM: Final = "text/event-stream"
DONE_EVENT: Final = b"data: [DONE]\n\n"
_STREAM_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# A span attribute holds at most this much of what the caller wrote (a model name, a path).
_MAX_ATTRIBUTE_CHARS: Final = 256


@attrs.frozen
class Outcome:
    """A whole generation, as a buffered answer reports it."""

    text: str
    finish_reason: str | None
    usage: GenerationUsage
    attempt_id: str | None
    ttft_ms: float | None
    tpot_ms: float | None
    worker_id: str | None = None


def _usage(usage: GenerationUsage | None) -> dict[str, int]:
    usage = usage or GenerationUsage()
    total = usage.total_tokens or usage.prompt_tokens + usage.completion_tokens
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens, "total_tokens": total}


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event: `data: {json}` and a blank line."""
    return b"data: " + dumps_json(event) + b"\n\n"


class Shape(Protocol):
    """How one surface renders a generation."""

    def body(self, outcome: Outcome) -> dict[str, Any]: ...
    def opening(self) -> list[dict[str, Any]]: ...
    def events(self, chunk: GenerateChunk) -> list[dict[str, Any]]: ...
    def error(self, exc: BaseException) -> dict[str, Any]: ...


@attrs.frozen
class NativeShape:
    """`{model, text, finish_reason, usage, attempt_id, ttft_ms, tpot_ms}`; events mirror the worker's chunks."""

    model: str
    request_id: str

    def body(self, outcome: Outcome) -> dict[str, Any]:
        return {"model": self.model, "text": outcome.text, "finish_reason": outcome.finish_reason,
                "usage": _usage(outcome.usage), "attempt_id": outcome.attempt_id, "ttft_ms": outcome.ttft_ms,
                "tpot_ms": outcome.tpot_ms}  # fmt: skip

    def opening(self) -> list[dict[str, Any]]:
        return []

    def events(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        event: dict[str, Any] = {"request_id": self.request_id, "seq": chunk.seq, "text_delta": chunk.text_delta,
                                 "done": chunk.done}  # fmt: skip
        if chunk.done:
            event.update(finish_reason=chunk.finish_reason, usage=_usage(chunk.usage), ttft_ms=chunk.ttft_ms,
                         tpot_ms=chunk.tpot_ms)  # fmt: skip
        return [event]

    def error(self, exc: BaseException) -> dict[str, Any]:
        return {"request_id": self.request_id, "done": True, "finish_reason": "error", "error": stream_error(exc)}


@attrs.frozen
class ChatShape:
    """OpenAI `chat.completion` and its `chat.completion.chunk` events."""

    model: str
    completion_id: str
    created: int
    include_usage: bool = False

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        chunk = {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.model, "system_fingerprint": None, "choices": choices}  # fmt: skip
        if self.include_usage:
            chunk["usage"] = None
        return {**chunk, **extra}

    def body(self, outcome: Outcome) -> dict[str, Any]:
        message = {"role": "assistant", "content": outcome.text}
        choice = {"index": 0, "message": message, "finish_reason": outcome.finish_reason, "logprobs": None}
        return {"id": self.completion_id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [choice], "usage": _usage(outcome.usage)}  # fmt: skip

    def opening(self) -> list[dict[str, Any]]:
        return [self._chunk([_delta({"role": "assistant", "content": ""})])]

    def events(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        events = [self._chunk([_delta({"content": chunk.text_delta})])] if chunk.text_delta else []
        if chunk.done:
            events.append(self._chunk([_delta({}, chunk.finish_reason)]))
            if self.include_usage:
                events.append(self._chunk([], usage=_usage(chunk.usage)))
        return events

    def error(self, exc: BaseException) -> dict[str, Any]:
        return {"error": stream_error(exc)}


def _delta(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


@attrs.frozen
class CompletionShape:
    """OpenAI `text_completion`, buffered and as events."""

    model: str
    completion_id: str
    created: int
    include_usage: bool = False

    def _completion(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.completion_id, "object": "text_completion", "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}  # fmt: skip

    def body(self, outcome: Outcome) -> dict[str, Any]:
        return self._completion([_text(outcome.text, outcome.finish_reason)], usage=_usage(outcome.usage))

    def opening(self) -> list[dict[str, Any]]:
        return []

    def events(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        events = []
        if chunk.text_delta or chunk.done:
            events.append(self._completion([_text(chunk.text_delta, chunk.finish_reason if chunk.done else None)]))
        if chunk.done and self.include_usage:
            events.append(self._completion([], usage=_usage(chunk.usage)))
        return events

    def error(self, exc: BaseException) -> dict[str, Any]:
        return {"error": stream_error(exc)}


def _text(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


class EventStream(StreamingResponse):
    """Server-sent events that end when the generation does or the client leaves, whichever is first; either way
    `on_close` runs (the generation is closed, announcing the cancel if the worker is still decoding). The client
    is watched on every ASGI version: a generation may wait long between chunks with nothing to send."""

    media_type = EVENT_STREAM

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(events, headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # ASGI 2.4 servers raise on a send to a client that left
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self._on_close()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]  # always our async generator


async def _events(generation: Streamed, shape: Shape, first: GenerateChunk) -> AsyncIterator[bytes]:
    for event in shape.opening():
        yield sse(event)
    chunk = first
    try:
        while True:
            for event in shape.events(chunk):
                yield sse(event)
            if chunk.done:
                break
            chunk = await generation.next()
    except Exception as exc:  # noqa: BLE001 - after the first event every failure is one terminal error event
        yield sse(shape.error(exc))
    yield DONE_EVENT


async def _outcome(generation: Streamed, first: GenerateChunk) -> Outcome:
    texts, chunk = [first.text_delta], first
    while not chunk.done:
        chunk = await generation.next()
        texts.append(chunk.text_delta)
    return Outcome("".join(texts), chunk.finish_reason, chunk.usage or GenerationUsage(), generation.attempt_id,
                   chunk.ttft_ms, chunk.tpot_ms, chunk.worker_id or first.worker_id)  # fmt: skip


class GenerationHandlers:
    """The three generation routes over one GenerationService. With `tracing` on, each request is a
    `gateway.proxy_chat` (chat) or `gateway.proxy_generate` (native, text completion) span lasting as long as its
    answer, streamed or not, whose context its work item carries to the worker."""

    def __init__(self, service: GenerationService, max_body_bytes: int, tracing: Tracing | None = None) -> None:
        self._service = service
        self._max_body_bytes = max_body_bytes
        self._tracing = tracing or Tracing.off()

    async def _body(self, request: Request) -> Any:
        raw = await read_body(request, self._max_body_bytes)
        return decode_data(raw, request.headers.get("content-type"))

    @endpoint(Surface.OPENAI)
    async def generate(self, request: Request) -> Response:
        call = generation_requests.parse_native(request.path_params["model"], await self._body(request))
        return await self._serve(request, call, _native_shape, GATEWAY_PROXY_GENERATE)

    @endpoint(Surface.OPENAI)
    async def chat_completions(self, request: Request) -> Response:
        call = generation_requests.parse_chat(await self._body(request))
        return await self._serve(request, call, functools.partial(_chat_shape, call), GATEWAY_PROXY_CHAT)

    @endpoint(Surface.OPENAI)
    async def completions(self, request: Request) -> Response:
        call = generation_requests.parse_completion(await self._body(request))
        return await self._serve(request, call, functools.partial(_completion_shape, call), GATEWAY_PROXY_GENERATE)

    async def _serve(
        self, request: Request, call: GenerateCall, shape_of: Callable[[Streamed], Shape], span_name: str
    ) -> Response:
        """Publish, wait for the first chunk (the client leaving cancels it), then stream or collect the rest."""
        trace = incoming_trace(request)
        span = self._open_span(request, call, span_name, trace)
        try:
            return await self._answer(request, call, shape_of, span, self._tracing.headers(span) or trace)
        except BaseException as exc:
            mark_failed(span, type(exc).__name__)
            span.end()
            raise

    async def _answer(
        self,
        request: Request,
        call: GenerateCall,
        shape_of: Callable[[Streamed], Shape],
        span: Span,
        trace: TraceHeaders | None,
    ) -> Response:
        started = time.perf_counter()
        running, first = await until_disconnect(request, self._begin(request, call, trace))
        span.set_attribute("sie.request_id", running.request_id)
        shape = shape_of(running)
        if call.stream:
            headers = {**VERSION_HEADERS, **_STREAM_HEADERS, REQUEST_ID: running.request_id}
            trace_id = trace_id_of(span)
            if trace_id is not None:
                headers[TRACE_ID] = trace_id
            return EventStream(_events(running, shape, first), functools.partial(_finish, running, span), headers)
        try:
            outcome = await until_disconnect(request, _outcome(running, first))
        finally:
            running.close()
        total_ms = (time.perf_counter() - started) * 1e3
        meta = ResponseMetadata(running.request_id, running.publish_ms, total_ms - running.publish_ms,
                                worker_id=outcome.worker_id, trace_id=trace_id_of(span))  # fmt: skip
        span.end()
        headers = response_headers(meta, total_ms)
        return Response(dumps_json(shape.body(outcome)), media_type=JSON_MEDIA_TYPE, headers=headers)

    def _open_span(self, request: Request, call: GenerateCall, name: str, trace: TraceHeaders | None) -> Span:
        """The request's span, which outlives this handler when the answer streams (`_finish` ends it); while
        tracing is off, INVALID_SPAN, whose calls do nothing."""
        if not self._tracing.enabled:
            return INVALID_SPAN
        attributes = {"sie.endpoint": request.url.path[:_MAX_ATTRIBUTE_CHARS],
                      "sie.model": call.model[:_MAX_ATTRIBUTE_CHARS]}  # fmt: skip
        return self._tracing.start(name, trace, attributes, kind=SERVER_SPAN)

    async def _begin(
        self, request: Request, call: GenerateCall, trace: TraceHeaders | None
    ) -> tuple[Streamed, GenerateChunk]:
        running = await self._service.start(call, lane_hints(request), trace)
        try:
            return running, await running.next()
        except BaseException:
            running.close()
            raise


def _native_shape(running: Streamed) -> Shape:
    return NativeShape(running.route.model, running.request_id)


def _chat_shape(call: GenerateCall, running: Streamed) -> Shape:
    return ChatShape(call.model, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), call.include_usage)


def _completion_shape(call: GenerateCall, running: Streamed) -> Shape:
    return CompletionShape(call.model, f"cmpl-{uuid.uuid4().hex}", int(time.time()), call.include_usage)


def _finish(running: Streamed, span: Span) -> None:
    """A streamed answer ended (done, failed or the client left): stop waiting for chunks, end the span."""
    running.close()
    span.end()
