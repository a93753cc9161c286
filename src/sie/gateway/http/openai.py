"""The OpenAI `/v1/embeddings` compatibility layer over encode (seed 000 §2; contracts Part B §1.5, A §2.6):
request parsing (text, or cl100k_base token ids that `openai_tokens` decodes off the loop), `dimensions`
(checked against the model before any work, then truncation and re-normalisation of Matryoshka vectors), the
16 MiB reply buffer cap, and the response shape. The handler decodes bytes, parses them here, and renders what
`embeddings` answers from the inference service's encode.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np

from sie.catalog import ModelConfig
from sie.gateway import assembly
from sie.gateway.errors import InvalidRequestError, PayloadTooLargeError
from sie.gateway.http.openai_tokens import decode_token_inputs
from sie.gateway.inference import InferenceService, Served
from sie.gateway.router import LaneHints, Route
from sie.telemetry.tracing import TraceHeaders
from sie.wire.http import EncodeParams, EncodeRequest, Item
from sie.wire.queue import WorkResult

# Seed 000 §2: the encode reply is buffered before reshaping; its own cap, apart from the request cap.
MAX_COMPAT_RESPONSE_BODY: Final = 16 * 2**20
ENCODING_FORMATS: Final = ("float", "base64")
TOKEN_SOURCE_WORKER: Final = "worker"
TOKEN_SOURCE_ESTIMATE: Final = "character_estimate"
TOKEN_SOURCE_REQUEST: Final = "request_token_ids"


_INPUT_SHAPES: Final = "a string, a list of strings, or token ids (a list of integers or a list of such lists)"


@attrs.frozen
class EmbeddingsCall:
    """A parsed `/v1/embeddings` request; `user` is accepted and ignored. Token-id inputs arrive in `token_ids`
    and become `texts` through `with_decoded_tokens`."""

    model: str
    texts: list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    token_ids: list[list[int]] | None = None

    def encode_request(self) -> EncodeRequest:
        items = [Item(text=text) for text in self.texts]
        return EncodeRequest(items=items, params=EncodeParams(output_types=["dense"]))


def parse_embeddings(data: Any) -> EmbeddingsCall:
    """Validate a decoded body; each refusal names its field (OpenAI `param`)."""
    if type(data) is not dict:
        raise InvalidRequestError("Request body must be a JSON object")
    model = data.get("model")
    if type(model) is not str or not model:
        raise InvalidRequestError("Field 'model' is required and must be a string", param="model")
    encoding_format = data.get("encoding_format") or "float"
    if encoding_format not in ENCODING_FORMATS:
        raise InvalidRequestError(
            f"Field 'encoding_format' must be one of {list(ENCODING_FORMATS)}, got {encoding_format!r}",
            param="encoding_format",
        )
    dimensions = _dimensions(data.get("dimensions"))
    texts, token_ids = _inputs(data.get("input"))
    return EmbeddingsCall(model, texts, encoding_format, dimensions, token_ids)


def _dimensions(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise InvalidRequestError(f"Field 'dimensions' must be a positive integer, got {value!r}", param="dimensions")
    return value


def _inputs(value: Any) -> tuple[list[str], list[list[int]] | None]:
    """(texts, None) for text input; ([], token id arrays) for token-id input."""
    if type(value) is str:
        return [value], None
    if type(value) is not list:
        raise InvalidRequestError(f"Field 'input' must be {_INPUT_SHAPES}", param="input")
    if not value:
        raise InvalidRequestError("Input cannot be empty", param="input")
    kinds = set(map(type, value))
    if kinds == {str}:
        return value, None
    if kinds == {int}:
        return [], [value]
    if kinds == {list} and all(_is_token_array(ids) for ids in value):
        return [], value
    raise InvalidRequestError(f"Field 'input' must be {_INPUT_SHAPES}", param="input")


def _is_token_array(value: list[Any]) -> bool:
    # `type(...) is int` keeps booleans out; an empty array encodes no text.
    return bool(value) and all(type(token) is int for token in value)


async def with_decoded_tokens(call: EmbeddingsCall) -> EmbeddingsCall:
    """`call` with token-id inputs decoded to the text they encode (off the event loop); text calls unchanged."""
    if call.token_ids is None:
        return call
    texts = await asyncio.to_thread(decode_token_inputs, call.token_ids)
    return attrs.evolve(call, texts=texts)


def check_dimensions(call: EmbeddingsCall, model: ModelConfig | None) -> None:
    """Refuse, before any work, a `dimensions` this model cannot honour (`check_truncation`)."""
    check_truncation(call.dimensions, call.model, model)


def check_truncation(
    dimensions: int | None, model_name: str, model: ModelConfig | None, param: str = "dimensions"
) -> None:
    """Refuse a requested width (`param`) wider than the model's dense vector, or narrower when the vector was not
    trained to be truncated (`tasks.encode.dense.matryoshka`); the OpenAI, TEI, Cohere and Ollama dialects share it."""
    if dimensions is None:
        return
    native = model.dims.get("dense") if model is not None else None
    if native is None:
        raise InvalidRequestError(f"Model '{model_name}' declares no dense embedding width", param=param)
    if dimensions > native:
        raise InvalidRequestError(
            f"Field '{param}' ({dimensions}) is larger than the {native} dimensions of model '{model_name}'",
            param=param,
        )
    if dimensions < native and not (model is not None and model.tasks.matryoshka):
        raise InvalidRequestError(
            f"Model '{model_name}' returns {native}-dimensional embeddings and was not trained to be truncated "
            f"(Matryoshka); omit '{param}' or set it to {native}",
            param=param,
        )


def check_reply_size(results: Sequence[WorkResult]) -> None:
    """Refuse a reply larger than the buffer: a terminal 413 naming the one remedy that works."""
    size = sum(result.result_msgpack.size_hint() for result in results if result.result_msgpack is not None)
    if size > MAX_COMPAT_RESPONSE_BODY:
        raise PayloadTooLargeError(
            f"The embeddings reply ({size} bytes) exceeds the {MAX_COMPAT_RESPONSE_BODY} byte limit of this "
            "endpoint; send fewer inputs per request",
            param="input",
        )


def _embedding(decoded: Any, encoding_format: str, dimensions: int | None) -> Any:
    values = np.asarray(decoded["dense"]["values"], dtype=np.float32)
    if dimensions is not None and dimensions < values.shape[0]:
        values = truncated(values, dimensions)
    if encoding_format == "base64":
        return base64.b64encode(values.astype("<f4", copy=False).tobytes()).decode("ascii")
    return values


def truncated(values: np.ndarray, dimensions: int) -> np.ndarray:
    """The leading `dimensions` values, scaled back to unit length (a zero vector stays zero)."""
    head = values[:dimensions]
    norm = float(np.linalg.norm(head))
    return head / np.float32(norm) if norm > 0 else head


def _usage(call: EmbeddingsCall, results: Sequence[WorkResult]) -> dict[str, Any]:
    tokens = sum(result.units.input_tokens for result in results if result.units is not None)
    source = TOKEN_SOURCE_WORKER
    if tokens <= 0 and call.token_ids is not None:
        tokens, source = sum(map(len, call.token_ids)), TOKEN_SOURCE_REQUEST
    elif tokens <= 0:
        tokens, source = max(1, sum(map(len, call.texts)) // 4), TOKEN_SOURCE_ESTIMATE
    return {"prompt_tokens": tokens, "total_tokens": tokens, "sie_token_source": source}


def embeddings_body(call: EmbeddingsCall, results: Sequence[WorkResult]) -> dict[str, Any]:
    """`{"object": "list", "data": [...], "model", "usage"}`; indices run 0..n-1 in input order."""
    data = [
        {"object": "embedding", "index": index,
         "embedding": _embedding(assembly.decode_result(result), call.encoding_format, call.dimensions)}
        for index, result in enumerate(results)
    ]  # fmt: skip
    return {"object": "list", "data": data, "model": call.model, "usage": _usage(call, results)}


async def embeddings(
    service: InferenceService, call: EmbeddingsCall, hints: LaneHints, trace: TraceHeaders | None = None
) -> Served:
    """OpenAI embeddings: an encode whose every item must succeed, reshaped under the 16 MiB reply cap."""
    call = await with_decoded_tokens(call)
    check = functools.partial(_check_routed_dimensions, call)
    collected = await service.encode_results(call.model, call.encode_request(), hints, trace, check)
    assembly.check_failures(collected.results, strict=True)
    check_reply_size(collected.results)
    return Served(embeddings_body(call, collected.results), collected.meta)


def _check_routed_dimensions(call: EmbeddingsCall, route: Route) -> None:
    check_dimensions(call, route.config)
