"""HTTP of text generation: `POST /v1/generate/{model:path}` (SIE-native), `POST /v1/chat/completions`,
`POST /v1/completions` and `POST /v1/responses` (OpenAI), each buffered or, with `stream: true`, as server-sent
events (seed 000 §2).

The handler waits for the first chunk before it answers, so every failure up to then is an HTTP error in the
OpenAI envelope; once events flow, a failure is one terminal event carrying `error` (then `data: [DONE]`; the
Responses API's named events end with `response.failed` instead). Each surface's shape (native, chat, completion,
response) renders the chunks; replies.py maps failures.
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
from sie.wire.queue import UnitCounts

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


def _units(usage: GenerationUsage | None) -> UnitCounts | None:
    """A finished generation's metered units: its prompt's tokens in, its completion's out."""
    if usage is None:
        return None
    return UnitCounts(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)


def _usage(usage: GenerationUsage | None) -> dict[str, int]:
    usage = usage or GenerationUsage()
    total = usage.total_tokens or usage.prompt_tokens + usage.completion_tokens
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens, "total_tokens": total}


def sse(event: dict[str, Any]) -> bytes:
    """One server-sent event: `data: {json}` and a blank line."""
    return b"data: " + dumps_json(event) + b"\n\n"


class Shape(Protocol):
    """How one surface renders a generation: its buffered body, its events, and how an event is framed."""

    closing: bytes  # what ends the event stream after the last event

    def body(self, outcome: Outcome) -> dict[str, Any]: ...
    def opening(self) -> list[dict[str, Any]]: ...
    def events(self, chunk: GenerateChunk) -> list[dict[str, Any]]: ...
    def error(self, exc: BaseException) -> dict[str, Any]: ...
    def frame(self, event: dict[str, Any]) -> bytes: ...


class DataEvents:
    """Events framed as `data: {json}` lines, ended by `data: [DONE]` (the chat, completion and native shapes)."""

    closing: bytes = DONE_EVENT

    def frame(self, event: dict[str, Any]) -> bytes:
        return sse(event)


@attrs.frozen
class NativeShape(DataEvents):
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
class ChatShape(DataEvents):
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
class CompletionShape(DataEvents):
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


class ResponseShape:
    """OpenAI's `response` object (one assistant message of `output_text`) and its named events: `response.created`,
    `response.in_progress`, the message and its text part added, `response.output_text.delta` per chunk, then the
    text, part and message done and `response.completed` (`response.failed` after a failure). A generation cut by
    `max_output_tokens` is `incomplete`. Stateful: one per request (event sequence numbers, the text so far)."""

    closing: bytes = b""

    def __init__(self, call: GenerateCall, response_id: str, created: int) -> None:
        self.call = call
        self.response_id = response_id
        self.message_id = f"msg_{response_id.removeprefix('resp_')}"
        self.created = created
        self._sequence = 0
        self._texts: list[str] = []

    def frame(self, event: dict[str, Any]) -> bytes:
        return b"event: " + event["type"].encode() + b"\n" + sse(event)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def _message(self, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [_output_text(text)]
        status = "in_progress" if text is None else "completed"
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def _response(self, status: str, text: str | None = None, **fields: Any) -> dict[str, Any]:
        params = self.call.params
        return {"id": self.response_id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": None, "instructions": None, "model": self.call.model,
                "output": [] if text is None else [self._message(text)], "parallel_tool_calls": False,
                "temperature": params.temperature, "top_p": params.top_p, "max_output_tokens": params.max_new_tokens,
                "tool_choice": "none", "tools": [], "text": {"format": {"type": "text"}}, "truncation": "disabled",
                "metadata": {}, "usage": None, **fields}  # fmt: skip

    def _finished(self, text: str, finish_reason: str | None, usage: GenerationUsage | None) -> dict[str, Any]:
        cut = finish_reason == "length"
        return self._response("incomplete" if cut else "completed", text, usage=_response_usage(usage),
                              incomplete_details={"reason": "max_output_tokens"} if cut else None)  # fmt: skip

    def body(self, outcome: Outcome) -> dict[str, Any]:
        return self._finished(outcome.text, outcome.finish_reason, outcome.usage)

    def opening(self) -> list[dict[str, Any]]:
        started = self._response("in_progress")
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started),
                self._event("response.output_item.added", output_index=0, item=self._message(None)),
                self._event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0,
                            part=_output_text(""))]  # fmt: skip

    def events(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        events = []
        if chunk.text_delta:
            self._texts.append(chunk.text_delta)
            events.append(self._event("response.output_text.delta", **where, delta=chunk.text_delta, logprobs=[]))
        if chunk.done:
            text = "".join(self._texts)
            events += [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                       self._event("response.content_part.done", **where, part=_output_text(text)),
                       self._event("response.output_item.done", output_index=0, item=self._message(text)),
                       self._event("response.completed" if chunk.finish_reason != "length" else "response.incomplete",
                                   response=self._finished(text, chunk.finish_reason, chunk.usage))]  # fmt: skip
        return events

    def error(self, exc: BaseException) -> dict[str, Any]:
        failure = stream_error(exc)
        error = {"code": failure["code"], "message": failure["message"]}
        return self._event("response.failed", response=self._response("failed", error=error))


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _response_usage(usage: GenerationUsage | None) -> dict[str, Any]:
    counts = _usage(usage)
    return {"input_tokens": counts["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}  # fmt: skip


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
        yield shape.frame(event)
    chunk = first
    try:
        while True:
            for event in shape.events(chunk):
                yield shape.frame(event)
            if chunk.done:
                break
            chunk = await generation.next()
    except Exception as exc:  # noqa: BLE001 - after the first event every failure is one terminal error event
        yield shape.frame(shape.error(exc))
    if shape.closing:
        yield shape.closing


async def _outcome(generation: Streamed, first: GenerateChunk) -> Outcome:
    texts, chunk = [first.text_delta], first
    while not chunk.done:
        chunk = await generation.next()
        texts.append(chunk.text_delta)
    return Outcome("".join(texts), chunk.finish_reason, chunk.usage or GenerationUsage(), generation.attempt_id,
                   chunk.ttft_ms, chunk.tpot_ms, chunk.worker_id or first.worker_id)  # fmt: skip


class GenerationHandlers:
    """The generation routes over one GenerationService. With `tracing` on, each request is a `gateway.proxy_chat`
    (chat, responses) or `gateway.proxy_generate` (native, text completion) span lasting as long as its answer,
    streamed or not, whose context its work item carries to the worker."""

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

    @endpoint(Surface.OPENAI)
    async def responses(self, request: Request) -> Response:
        call = generation_requests.parse_responses(await self._body(request))
        return await self._serve(request, call, functools.partial(_response_shape, call), GATEWAY_PROXY_CHAT)

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
                                worker_id=outcome.worker_id, trace_id=trace_id_of(span),
                                units=_units(outcome.usage))  # fmt: skip
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


def _response_shape(call: GenerateCall, running: Streamed) -> Shape:
    return ResponseShape(call, f"resp_{uuid.uuid4().hex}", int(time.time()))


def _finish(running: Streamed, span: Span) -> None:
    """A streamed answer ended (done, failed or the client left): stop waiting for chunks, end the span."""
    running.close()
    span.end()
