"""Messages on the work queue: WorkItem (gateway → sidecar), WorkResult and ResultChunkV1 (sidecar → gateway).

Fields follow contracts Part A §2.2 and Part B §4.1–4.2; `admission_pool`, `accepts_result_chunks` and
the chunk envelope come from seeds 000 §8.4 and 001, WorkResult's `direct_origin` from seed 000 §8.2. Optional
fields left as None are omitted on the wire.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from sie.wire._fields import omittable
from sie.wire.payload import ResultBody, result_body

OPERATION_ENCODE: Final = "encode"
OPERATION_SCORE: Final = "score"
OPERATION_EXTRACT: Final = "extract"
OPERATION_LOAD: Final = "load"
OPERATION_GENERATE: Final = "generate"
# Answered by the sidecar with the model's tokenizer, never sent to a worker (TEI's /tokenize and /decode).
OPERATION_TOKENIZE: Final = "tokenize"
OPERATION_DECODE: Final = "decode"

RESULT_CHUNK_KIND: Final = "result_chunk_v1"
# Bounds of one v1 transfer (seed 001, Preparation And Framing).
RESULT_CHUNK_MAX_PAYLOAD_BYTES: Final = 768 * 1024
RESULT_CHUNK_MAX_TOTAL_BYTES: Final = 16 * 1024 * 1024
RESULT_CHUNK_MAX_COUNT: Final = 64


@attrs.frozen(kw_only=True)
class GenerateParams:
    """Generation settings a work item carries (`WorkItem.generate`): the contract's five fields, plus ours.

    Exactly one of `prompt` (raw text, continued as is) and `messages` (chat turns `{role, content}`, rendered with
    the model's chat template and an open assistant turn) is set. Unset sampling fields take the model's defaults;
    the worker validates every value (`sie.worker.generation.sampling.SamplingParams`).
    """

    prompt: str | None = omittable()
    max_new_tokens: int | None = omittable()
    temperature: float | None = omittable()
    top_p: float | None = omittable()
    stop: list[str] | None = omittable()
    # Ours (readers of the public contract ignore them).
    messages: list[dict[str, Any]] | None = omittable()
    top_k: int | None = omittable()
    seed: int | None = omittable()
    stop_token_ids: list[int] | None = omittable()
    presence_penalty: float | None = omittable()
    frequency_penalty: float | None = omittable()
    # A chat request's template switches (`sie.catalog.options.CHAT_TEMPLATE_SWITCHES`); the entry's win over them.
    chat_template_kwargs: dict[str, Any] | None = omittable()


@attrs.frozen(kw_only=True)
class WorkItem:
    """One unit of queued work; encode/extract publish one per input item, score one per request."""

    work_item_id: str
    request_id: str
    item_index: int
    total_items: int
    operation: str
    model_id: str
    profile_id: str
    pool_name: str
    machine_profile: str
    router_id: str
    reply_subject: str
    timestamp: float
    bundle_config_hash: str | None = omittable()
    display_model: str | None = omittable()
    item: dict[str, Any] | None = omittable()
    payload_ref: str | None = omittable()
    output_types: list[str] | None = omittable()
    instruction: str | None = omittable()
    is_query: bool = False
    options: dict[str, Any] | None = omittable()
    query_item: dict[str, Any] | None = omittable()
    query_payload_ref: str | None = omittable()
    score_items: list[dict[str, Any]] | None = omittable()
    labels: list[str] | None = omittable()
    output_schema: dict[str, Any] | None = omittable()
    generate: GenerateParams | None = omittable()
    traceparent: str | None = omittable()
    tracestate: str | None = omittable()
    deadline: float | None = omittable()
    fallback_reason: str | None = omittable()
    admission_pool: str | None = omittable()
    accepts_result_chunks: bool = False


@attrs.frozen(kw_only=True)
class UnitCounts:
    """Billable units of one item, as the worker counted them."""

    input_tokens: int = 0
    pages: int = 0
    images: int = 0
    audio_ms: int = 0
    pairs: int = 0
    content_input_tokens: int = 0
    output_tokens: int = 0


@attrs.frozen(kw_only=True)
class WorkResult:
    """The outcome of one work item; `result_msgpack` holds the public result body, packed only when the
    result crosses NATS (wire.payload)."""

    work_item_id: str
    request_id: str
    item_index: int
    success: bool
    result_msgpack: ResultBody | None = omittable(converter=result_body)
    error: str | None = omittable()
    error_code: str | None = omittable()
    inference_ms: float | None = omittable()
    queue_ms: float | None = omittable()
    processing_ms: float | None = omittable()
    worker_id: str | None = omittable()
    tokenization_ms: float | None = omittable()
    postprocessing_ms: float | None = omittable()
    payload_fetch_ms: float | None = omittable()
    units: UnitCounts | None = omittable()
    execution_identity_sha256: str | None = omittable()
    executed_bundle_config_hash: str | None = omittable()
    retry_after_s: int | None = omittable()
    # True on the result of an item the sidecar took from its worker's direct-dispatch stream (seed 000 §8.2: the
    # gateway ignores such a result for an item it has since published on the lane). Absent otherwise: None is left
    # off the wire, so older peers read and write the same messages.
    direct_origin: bool | None = omittable()


@attrs.frozen(kw_only=True)
class ResultChunkV1:
    """One ordered slice of a serialized WorkResult too large for one NATS message (seed 001).

    `payload` slices the exact WorkResult bytes; `transfer_digest` is their SHA-256 and `total_bytes`
    their length. Field names mirror the IPC `IpcResponseChunkV1`, plus the item's identity.
    """

    request_id: str
    work_item_id: str
    item_index: int
    transfer_digest: bytes
    chunk_index: int
    chunk_count: int
    total_bytes: int
    payload: bytes
    kind: str = RESULT_CHUNK_KIND


def is_result_chunk(message: dict[str, Any]) -> bool:
    """True for a decoded inbox message that is a v1 chunk: exactly `kind == "result_chunk_v1"` (seed 000 §16.2)."""
    return message.get("kind") == RESULT_CHUNK_KIND
