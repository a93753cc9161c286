"""Bodies of the SIE-native inference API: encode, score and extract requests and responses.

Shapes follow contracts Part B §1.2–1.4 and the SDK wire of Part A §2.5. Requests fields left as None
are omitted on the wire; readers ignore unknown fields.
"""

from __future__ import annotations

from typing import Any, Final, NewType

import attrs
import numpy as np

from sie.wire._fields import array, non_empty, omittable

# Raw media bytes: msgpack bin, or a base64 string in a JSON body (seed 000 §2, gateway JSON edge).
MediaBytes = NewType("MediaBytes", bytes)

# The response header of each unit a request is metered in (`sie.wire.queue.UnitCounts`' fields), which clients
# read into a result's `request.usage`; HTTP header names are case-insensitive, these are sent lowercase.
UNIT_HEADERS: Final = {
    "input_tokens": "x-sie-units-input-tokens",
    "pairs": "x-sie-units-pairs",
    "content_input_tokens": "x-sie-units-content-input-tokens",
    "images": "x-sie-units-images",
    "pages": "x-sie-units-pages",
    "output_tokens": "x-sie-units-output-tokens",
    "audio_ms": "x-sie-units-audio-ms",
}


@attrs.frozen(kw_only=True)
class ImageInput:
    """One image of an item: compressed bytes and their format (`jpeg`, `png`, ...)."""

    data: MediaBytes
    format: str | None = omittable()


@attrs.frozen(kw_only=True)
class AudioInput:
    """Compressed audio bytes of an item."""

    data: MediaBytes
    format: str | None = omittable()
    sample_rate: int | None = omittable()


@attrs.frozen(kw_only=True)
class DocumentInput:
    """A document (pdf, docx, html, ...) of an item."""

    data: MediaBytes
    format: str | None = omittable()


@attrs.frozen(kw_only=True)
class Item:
    """One input of a request; every field is optional (SDK `Item`, contracts Part B §2.4)."""

    id: str | None = omittable()
    text: str | None = omittable()
    images: list[ImageInput] | None = omittable()
    audio: AudioInput | None = omittable()
    # The video shape is not pinned by any contract, so it stays a map for the adapter to read.
    video: dict[str, Any] | None = omittable()
    document: DocumentInput | None = omittable()
    metadata: dict[str, Any] | None = omittable()
    # A precomputed [tokens, dims] multi-vector, carried as an ndarray map.
    multivector: np.ndarray | None = array(default=None, omit=True)


# The encode output dtypes SIE serves (contracts Part B §1.2): what `params.output_dtype` and the
# `output_dtype` option may name. The SDK's DType also lists bfloat16, which the public server refuses too:
# numpy has no bfloat16, so no vector could carry it.
OUTPUT_DTYPES: Final = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


@attrs.frozen(kw_only=True)
class EncodeParams:
    """`params` of an encode request; `is_query` travels as `options["is_query"]`."""

    output_types: list[str] | None = omittable()
    output_dtype: str | None = omittable()
    instruction: str | None = omittable()
    options: dict[str, Any] | None = omittable()


@attrs.frozen(kw_only=True)
class EncodeRequest:
    """Body of `POST /v1/encode/{model}`."""

    items: list[Item] = attrs.field(validator=non_empty)
    params: EncodeParams | None = omittable()


@attrs.frozen(kw_only=True)
class ScoreRequest:
    """Body of `POST /v1/score/{model}`: query, instruction and options sit at the top level, no `params`."""

    query: Item
    items: list[Item] = attrs.field(validator=non_empty)
    instruction: str | None = omittable()
    options: dict[str, Any] | None = omittable()


@attrs.frozen(kw_only=True)
class ExtractParams:
    """`params` of an extract request."""

    labels: list[str] | None = omittable()
    output_schema: dict[str, Any] | None = omittable()
    instruction: str | None = omittable()
    options: dict[str, Any] | None = omittable()
    # Extraction returns no vectors: the gateway refuses a request that sets it rather than ignore it.
    output_dtype: str | None = omittable()


@attrs.frozen(kw_only=True)
class ExtractRequest:
    """Body of `POST /v1/extract/{model}`."""

    items: list[Item] = attrs.field(validator=non_empty)
    params: ExtractParams | None = omittable()


@attrs.frozen(kw_only=True)
class DenseEmbedding:
    """A dense vector; for `binary`/`ubinary` the values are packed bits and `dims` stays the model dim."""

    dims: int
    dtype: str
    values: np.ndarray = array()


@attrs.frozen(kw_only=True)
class SparseEmbedding:
    """A sparse vector: token indices and weights; `dims` is the vocabulary size when known."""

    dims: int | None
    dtype: str
    indices: np.ndarray = array()
    values: np.ndarray = array()


@attrs.frozen(kw_only=True)
class MultivectorEmbedding:
    """One vector per token: `values` has shape [num_tokens, token_dims]."""

    token_dims: int
    num_tokens: int
    dtype: str
    values: np.ndarray = array()


@attrs.frozen(kw_only=True)
class EncodeResult:
    """One encoded item: `id` only when the request item had one, and one entry per requested output."""

    id: str | None = omittable()
    dense: DenseEmbedding | None = omittable()
    sparse: SparseEmbedding | None = omittable()
    multivector: MultivectorEmbedding | None = omittable()


@attrs.frozen(kw_only=True)
class TimingInfo:
    """Server-side stage durations of one request, in milliseconds."""

    total_ms: float
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    postprocessing_ms: float | None = None


@attrs.frozen(kw_only=True)
class EncodeResponse:
    """Response of an encode request."""

    model: str
    items: list[EncodeResult]
    # Omitted when None, as the gateway's `{"model", "items"}` envelope does (contracts Part B §1.9, §1.10).
    timing: TimingInfo | None = omittable()


@attrs.frozen(kw_only=True)
class ScoreEntry:
    """One scored candidate; rank 0 is the best, `item_id` defaults to `item-{i}`."""

    item_id: str
    score: float
    rank: int


@attrs.frozen(kw_only=True)
class ScoreResponse:
    """Response of a score request, sorted by score descending."""

    model: str
    query_id: str | None
    scores: list[ScoreEntry]


@attrs.frozen(kw_only=True)
class Entity:
    """A span found by extraction; `bbox` is set for visual inputs."""

    text: str
    label: str
    score: float
    start: int | None = None
    end: int | None = None
    bbox: list[float] | None = None


@attrs.frozen(kw_only=True)
class Relation:
    """A relation between two extracted spans."""

    head: str
    tail: str
    relation: str
    score: float


@attrs.frozen(kw_only=True)
class Classification:
    """A label given to a whole item."""

    label: str
    score: float


@attrs.frozen(kw_only=True)
class DetectedObject:
    """An object found in an image; `bbox` is `[x, y, w, h]`."""

    label: str
    score: float
    bbox: list[float]


@attrs.frozen(kw_only=True)
class ExtractResult:
    """One extracted item: the four lists and `data` are always present, empty when nothing was found."""

    id: str
    entities: list[Entity] = attrs.Factory(list)
    relations: list[Relation] = attrs.Factory(list)
    classifications: list[Classification] = attrs.Factory(list)
    objects: list[DetectedObject] = attrs.Factory(list)
    data: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class ExtractResponse:
    """Response of an extract request."""

    model: str
    items: list[ExtractResult]
