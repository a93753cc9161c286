"""Messages of streamed generation: the IPC `ProcessGenerate` call and its `GenerateEvent` frames (sidecar ↔ worker,
contracts Part A §2.1), and the `GenerateChunk` each `publish` event carries to the gateway's inbox (seed 001,
Generation).

One generation is one work item (`operation: "generate"`). The worker answers ProcessGenerate with a stream of
events sharing the call's request_id: `publish` (send `payload`, a packed GenerateChunk, to the reply subject),
`ack` (settle the JetStream message: the stream has begun and is not redelivered from here), `nak` (give it back,
after `delay_ms`), `in_progress` (still working) and, last, `done`. The sidecar obeys them in order.

A GenerateChunk's `seq` counts from 0 within one attempt; the terminal chunk has `done: true`, the finish reason,
the token usage and the timings. The gateway keeps the chunks of the first attempt that reaches it.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from sie.wire._fields import omittable

GENERATE_CHUNK_KIND: Final = "generate_chunk"

EVENT_PUBLISH: Final = "publish"
EVENT_ACK: Final = "ack"
EVENT_NAK: Final = "nak"
EVENT_IN_PROGRESS: Final = "in_progress"
EVENT_DONE: Final = "done"

FINISH_STOP: Final = "stop"
FINISH_LENGTH: Final = "length"
FINISH_CANCELLED: Final = "cancelled"
FINISH_ERROR: Final = "error"


@attrs.frozen(kw_only=True)
class ProcessGenerateRequest:
    """Run one generation work item (`work_item_msgpack`: the WorkItem as the queue carried it, msgpack)."""

    model_id: str
    work_item_msgpack: bytes


@attrs.frozen(kw_only=True)
class GenerateEvent:
    """One frame of a ProcessGenerate answer: what the sidecar does next (module docstring)."""

    kind: str
    reply_subject: str = ""
    payload: bytes = b""
    delay_ms: int = 0
    error: str | None = None


@attrs.frozen(kw_only=True)
class GenerationUsage:
    """Tokens of one generation: the rendered prompt's and the generated ones (stop tokens not counted)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@attrs.frozen(kw_only=True)
class GenerateChunk:
    """One streamed piece of a generation, as the gateway's inbox receives it.

    `text_delta` is new text (never part of a stop string). Only the terminal chunk (`done`) sets `finish_reason`
    (stop | length | cancelled | error), `usage`, `ttft_ms` and `tpot_ms`; a failed generation's terminal chunk
    carries `error` and `error_code` (a `sie.wire.codes` code) and, for RESOURCE_EXHAUSTED, `retry_after_s`.
    """

    request_id: str
    work_item_id: str
    attempt_id: str
    seq: int
    text_delta: str = ""
    done: bool = False
    finish_reason: str | None = omittable()
    usage: GenerationUsage | None = omittable()
    ttft_ms: float | None = omittable()
    tpot_ms: float | None = omittable()
    error: str | None = omittable()
    error_code: str | None = omittable()
    retry_after_s: int | None = omittable()
    worker_id: str | None = omittable()
    kind: str = GENERATE_CHUNK_KIND


def is_generate_chunk(message: dict[str, Any]) -> bool:
    """True for a decoded inbox message that is a generation chunk: exactly `kind == "generate_chunk"`."""
    return message.get("kind") == GENERATE_CHUNK_KIND
