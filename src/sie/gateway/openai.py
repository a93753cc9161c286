"""The OpenAI `/v1/embeddings` compatibility layer over encode (seed 000 §2; contracts Part B §1.5, A §2.6):
request parsing (text only: token arrays are refused), the 16 MiB reply buffer cap, and the response shape.
Pure: the handler decodes bytes, calls the service's encode, and renders what this module builds.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final

import attrs
import numpy as np

from sie.gateway import assembly
from sie.gateway.errors import InvalidRequestError, PayloadTooLargeError
from sie.wire.http import EncodeParams, EncodeRequest, Item
from sie.wire.queue import WorkResult

# Seed 000 §2: the encode reply is buffered before reshaping; its own cap, apart from the request cap.
MAX_COMPAT_RESPONSE_BODY: Final = 16 * 2**20
ENCODING_FORMATS: Final = ("float", "base64")
TOKEN_SOURCE_WORKER: Final = "worker"
TOKEN_SOURCE_ESTIMATE: Final = "character_estimate"


@attrs.frozen
class EmbeddingsCall:
    """A parsed `/v1/embeddings` request; `dimensions` and `user` are accepted and ignored."""

    model: str
    texts: list[str]
    encoding_format: str = "float"

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
    return EmbeddingsCall(model, _texts(data.get("input")), encoding_format)


def _texts(value: Any) -> list[str]:
    if type(value) is str:
        return [value]
    if type(value) is not list:
        raise InvalidRequestError("Field 'input' must be a string or a list of strings", param="input")
    if not value:
        raise InvalidRequestError("Input cannot be empty", param="input")
    kinds = set(map(type, value))
    if kinds <= {str}:
        return value
    if kinds & {int, list}:
        # Token ids are never guessed back into text (contracts Part B §10.6).
        raise InvalidRequestError("Token-id inputs are not supported; send the input as text", param="input")
    raise InvalidRequestError("Field 'input' must be a string or a list of strings", param="input")


def check_reply_size(results: Sequence[WorkResult]) -> None:
    """Refuse a reply larger than the buffer: a terminal 413 naming the one remedy that works."""
    size = sum(result.result_msgpack.size_hint() for result in results if result.result_msgpack is not None)
    if size > MAX_COMPAT_RESPONSE_BODY:
        raise PayloadTooLargeError(
            f"The embeddings reply ({size} bytes) exceeds the {MAX_COMPAT_RESPONSE_BODY} byte limit of this "
            "endpoint; send fewer inputs per request",
            param="input",
        )


def _embedding(decoded: Any, encoding_format: str) -> Any:
    values = np.asarray(decoded["dense"]["values"], dtype=np.float32)
    if encoding_format == "base64":
        return base64.b64encode(values.astype("<f4", copy=False).tobytes()).decode("ascii")
    return values


def _usage(call: EmbeddingsCall, results: Sequence[WorkResult]) -> dict[str, Any]:
    tokens = sum(result.units.input_tokens for result in results if result.units is not None)
    source = TOKEN_SOURCE_WORKER
    if tokens <= 0:
        tokens, source = max(1, sum(map(len, call.texts)) // 4), TOKEN_SOURCE_ESTIMATE
    return {"prompt_tokens": tokens, "total_tokens": tokens, "sie_token_source": source}


def embeddings_body(call: EmbeddingsCall, results: Sequence[WorkResult]) -> dict[str, Any]:
    """`{"object": "list", "data": [...], "model", "usage"}`; indices run 0..n-1 in input order."""
    data = [
        {"object": "embedding", "embedding": _embedding(assembly.decode_result(result), call.encoding_format),
         "index": index}
        for index, result in enumerate(results)
    ]  # fmt: skip
    return {"object": "list", "data": data, "model": call.model, "usage": _usage(call, results)}
