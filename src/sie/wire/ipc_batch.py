"""IPC method bodies for batched inference: batch items, RunBatch, and the per-item outcomes (contracts Part A §2.1).

A field with no listed default is required unless nullable (then None). Vector values in RawOutput
are ndarrays in Python; the list form of the contract is accepted on read.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import numpy as np

from sie.wire._fields import TokenRows, array, omittable, token_rows
from sie.wire.payload import ResultBody, result_body
from sie.wire.queue import UnitCounts

OP_ENCODE: Final = "encode"
OP_SCORE: Final = "score"
OP_EXTRACT: Final = "extract"

DISPOSITION_PUBLISH_AND_ACK: Final = "publish_and_ack"
DISPOSITION_PUBLISH_ERROR_AND_ACK: Final = "publish_error_and_ack"
DISPOSITION_NAK_RETRY: Final = "nak_retry"


@attrs.frozen(kw_only=True)
class PreparedTokens:
    """Sidecar tokenization of one item: ragged, truncated, unpadded id rows (for score, row 0 is the query),
    int64 arrays in Python and lists of ints on the IPC wire."""

    input_ids: TokenRows = token_rows()
    tokenizer_id: str
    attention_mask: TokenRows = token_rows()
    token_type_ids: TokenRows = token_rows()
    max_seq_len: int = 0


@attrs.frozen(kw_only=True)
class PreparedPixels:
    """Sidecar preprocessing of one item's images (our addition): float32 pixel values [images, 3, height, width]
    as the model's image processor makes them, or, where an image could not be decoded, the reason (the worker
    answers that item INVALID_INPUT)."""

    pixel_values: np.ndarray | None = array("float32", default=None, omit=True)
    error: str | None = omittable()


@attrs.frozen(kw_only=True)
class EncodeBatchItem:
    """One encode work item as the worker sees it."""

    work_item_id: str
    request_id: str
    item_index: int
    total_items: int
    timestamp: float
    item: dict[str, Any]
    output_types: list[str] | None = None
    instruction: str | None = None
    is_query: bool = False
    options: dict[str, Any] | None = None
    profile_id: str | None = None
    bundle_config_hash: str | None = None
    numerical_admission_sha256: str | None = None
    payload_fetch_ms: float = 0.0
    prepared_tokens: PreparedTokens | None = None
    prepared_pixels: PreparedPixels | None = omittable()


@attrs.frozen(kw_only=True)
class ScoreBatchItem:
    """One score work item: a query and all its candidates."""

    work_item_id: str
    request_id: str
    item_index: int
    total_items: int
    timestamp: float
    query_item: dict[str, Any]
    score_items: list[dict[str, Any]]
    instruction: str | None = None
    options: dict[str, Any] | None = None
    profile_id: str | None = None
    bundle_config_hash: str | None = None
    numerical_admission_sha256: str | None = None
    payload_fetch_ms: float = 0.0
    prepared_tokens: PreparedTokens | None = None
    # Our addition: an image model's pixels of the query and of each candidate, in that order (None for an entry
    # without images).
    prepared_pixels: list[PreparedPixels | None] | None = omittable()


@attrs.frozen(kw_only=True)
class ExtractBatchItem:
    """One extract work item."""

    work_item_id: str
    request_id: str
    item_index: int
    total_items: int
    timestamp: float
    item: dict[str, Any]
    labels: list[str] | None = None
    output_schema: dict[str, Any] | None = None
    instruction: str | None = None
    options: dict[str, Any] | None = None
    profile_id: str | None = None
    bundle_config_hash: str | None = None
    payload_fetch_ms: float = 0.0
    # PreparedAudioPcm16: its fields are not in the contract, so it stays a map.
    prepared_audio: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ProcessEncodeBatchRequest:
    """Body of ProcessEncodeBatch."""

    model_id: str
    items: list[EncodeBatchItem]
    accepts_batched_f16_multivectors: bool = False


@attrs.frozen(kw_only=True)
class ProcessScoreBatchRequest:
    """Body of ProcessScoreBatch."""

    model_id: str
    items: list[ScoreBatchItem]


@attrs.frozen(kw_only=True)
class ProcessExtractBatchRequest:
    """Body of ProcessExtractBatch."""

    model_id: str
    items: list[ExtractBatchItem]


@attrs.frozen(kw_only=True)
class RunBatchItem:
    """One item of a RunBatch; exactly the field named by `op` is set. `traceparent`/`tracestate` are the W3C
    context the worker's span continues, left out on the wire while None (older readers default them)."""

    op: str
    work_item_id: str = ""
    request_id: str = ""
    item_index: int = 0
    encode: EncodeBatchItem | None = None
    score: ScoreBatchItem | None = None
    extract: ExtractBatchItem | None = None
    traceparent: str | None = omittable()
    tracestate: str | None = omittable()


@attrs.frozen(kw_only=True)
class RunBatchRequest:
    """Body of RunBatch (and its V1 variants): one op per batch; `lora_key` "" is the base model."""

    model_id: str
    batch_id: int
    lora_key: str
    total_cost: int
    items: list[RunBatchItem]
    accepts_batched_f16_multivectors: bool = False


@attrs.frozen(kw_only=True)
class DenseRaw:
    """A dense vector before public framing; the sidecar normalizes when `normalize` is set."""

    values: np.ndarray = array("float32")
    dim: int
    normalize: bool = False


@attrs.frozen(kw_only=True)
class ScoreRaw:
    """Scores of a score item, in the order of `item_ids`."""

    scores: list[float]
    item_ids: list[str]


@attrs.frozen(kw_only=True)
class SparseRaw:
    """A sparse vector before public framing."""

    indices: np.ndarray = array("int32")
    values: np.ndarray = array("float32")
    dims: int | None = None


@attrs.frozen(kw_only=True)
class MultivectorRaw:
    """Token vectors before public framing; `values_f16` carries them as float16 bytes when negotiated."""

    values: np.ndarray = array("float32")
    num_tokens: int
    token_dims: int
    dtype: str = "float32"
    values_f16: bytes = b""


@attrs.frozen(kw_only=True)
class RawOutput:
    """The model output of one item; exactly one variant is set."""

    dense: DenseRaw | None = None
    score: ScoreRaw | None = None
    sparse: SparseRaw | None = None
    multivector: MultivectorRaw | None = None

    def __attrs_post_init__(self) -> None:
        variants = (self.dense, self.score, self.sparse, self.multivector)
        if sum(variant is not None for variant in variants) != 1:
            raise ValueError("RawOutput must set exactly one of dense, score, sparse, multivector")


@attrs.frozen(kw_only=True)
class ItemOutcome:
    """What the sidecar does with one item; with `raw_output` set, `result_msgpack` stays empty. The result
    body is packed only when the outcome crosses the IPC socket (wire.payload)."""

    work_item_id: str
    request_id: str
    item_index: int
    disposition: str
    nak_delay_ms: int = 0
    result_msgpack: ResultBody | None = attrs.field(default=None, converter=result_body)
    error: str | None = None
    error_code: str | None = None
    inference_ms: float = 0.0
    tokenization_ms: float = 0.0
    postprocessing_ms: float = 0.0
    raw_output: RawOutput | None = None
    units: UnitCounts | None = None
    retry_after_s: int | None = None


@attrs.frozen(kw_only=True)
class BatchOutcome:
    """Response body of every batch method: one outcome per item."""

    outcomes: list[ItemOutcome]
    # Element shape not pinned by the contract; passed through as decoded.
    batched_f16_multivectors: list[Any] = attrs.Factory(list)
