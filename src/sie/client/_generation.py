"""Text generation on the wire as sie-sdk 0.10.1 speaks it: the JSON request, the buffered result, and the
server-sent events of a stream (`data: {json}` per chunk, then `data: [DONE]`). Pure, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from sie.client._failures import ErrorResponse
from sie.client.errors import RequestError, ServerError
from sie.wire import DecodeError, loads_json
from sie.wire.codes import RESOURCE_EXHAUSTED

EVENT_STREAM = "text/event-stream"
_DONE = "[DONE]"
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


@attrs.frozen(kw_only=True)
class GenerateParams:
    """The body parameters of one generate call; `None` leaves a sampler setting to the model's default."""

    prompt: str
    max_new_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    stop: Sequence[str] | None = None
    seed: int | None = None


def generate_path(model: str) -> str:
    """`/v1/generate/{model}` with `org/name` spelled `org__name`, the gateway's path-safe model id."""
    return f"/v1/generate/{model.replace('/', '__')}"


def generate_body(params: GenerateParams, options: Mapping[str, Any] | None, *, stream: bool) -> dict[str, Any]:
    """`{prompt, max_new_tokens, stop?, temperature?, top_p?, seed?, options?, stream?}`: unset fields stay out."""
    body: dict[str, Any] = {"prompt": params.prompt, "max_new_tokens": params.max_new_tokens}
    if params.stop is not None:
        body["stop"] = list(params.stop)
    optional = {"temperature": params.temperature, "top_p": params.top_p, "seed": params.seed, "options": options}
    body.update({key: value for key, value in optional.items() if value is not None})
    if stream:
        body["stream"] = True
    return body


def parse_generate(data: Mapping[str, Any]) -> dict[str, Any]:
    """`{model, text, finish_reason?, usage?, attempt_id?, ttft_ms?, tpot_ms?}`; `model` and `text` must be strings.

    Like sie-sdk, optional fields of the wrong type are left out rather than failing the call.
    """
    result: dict[str, Any] = {}
    for field in ("model", "text"):
        value = data.get(field)
        if not isinstance(value, str):
            raise RequestError(f"Generate response missing string '{field}' field: got {type(value).__name__}")
        result[field] = value
    for field in ("finish_reason", "attempt_id"):
        if isinstance(data.get(field), str):
            result[field] = data[field]
    usage = data.get("usage")
    if isinstance(usage, Mapping):
        result["usage"] = {field: _token_count(usage.get(field)) for field in _USAGE_FIELDS}
    for field in ("ttft_ms", "tpot_ms"):
        value = data.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            result[field] = float(value)
    return result


def _token_count(value: Any) -> int:
    # A junk count (None, "n/a", NaN) reads as 0 instead of escaping as a ValueError.
    if isinstance(value, int | float) and math.isfinite(value):
        return int(value)
    return 0


def _payload(line: str) -> str | None:
    # One `data:` line's payload (a single leading space dropped); blank lines, `:` comments and other fields skip.
    if not line.startswith("data:"):
        return None
    return line[len("data:") :].removeprefix(" ")


def sse_payloads(lines: Iterable[str]) -> Iterator[str]:
    """The `data:` payloads of an event stream's lines, up to `[DONE]` or the end of the stream."""
    for line in lines:
        payload = _payload(line)
        if payload == _DONE:
            return
        if payload is not None:
            yield payload


async def asse_payloads(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """The async mirror of `sse_payloads`."""
    async for line in lines:
        payload = _payload(line)
        if payload == _DONE:
            return
        if payload is not None:
            yield payload


def read_chunk(payload: str) -> dict[str, Any]:
    """One event's chunk: `{request_id, seq, text_delta, done, finish_reason?, usage?, ttft_ms?}` or an error event."""
    try:
        chunk = loads_json(payload)
    except DecodeError as exc:
        raise RequestError(f"Malformed SSE chunk from server: {exc}") from exc
    if not isinstance(chunk, dict):
        raise RequestError(f"Malformed SSE chunk from server: a {type(chunk).__name__}, not an object")
    return chunk


def chunk_error(chunk: Mapping[str, Any]) -> ErrorResponse | None:
    """An error event as the 503 the retry ladder reads (sie-sdk does the same), or None for a chunk of text.

    The gateway sends `error: {code, message, type, param}`, with `retry_after_s` (1–60) for RESOURCE_EXHAUSTED.
    """
    error = chunk.get("error")
    if not isinstance(error, Mapping):
        return None
    code = str(error.get("code") or "error")
    hint = error.get("retry_after_s")
    trusted = code == RESOURCE_EXHAUSTED and type(hint) is int and 1 <= hint <= 60
    return ErrorResponse(
        status_code=503,
        code=code,
        message=str(error.get("message") or "stream error"),
        retry_after=float(hint) if trusted else None,
        fields=error,
    )


def stream_failure(error: ErrorResponse) -> ServerError:
    """The error an error event raises once text was already yielded: never retried, the generation ran."""
    return ServerError(error.message, error.code, param=error.param, retry_after=error.retry_after)
