"""The Cohere and Jina dialects over score and encode: `POST /v1/rerank`, `/v2/rerank` (and a `/rerank` body with
`documents`) and Cohere's `POST /v2/embed`. The model is the body's `model`.

- rerank: `query`, `documents` (strings or `{text}` objects), `top_n`, `return_documents` (default true on `/v1`
  and `/rerank`, as Jina's and Cohere v1's, false on `/v2`) → `{id, model, results: [{index, relevance_score,
  document?: {text}}], meta: {billed_units: {search_units: 1}}, usage: {total_tokens}}` (Cohere's fields and
  Jina's `usage`). `max_tokens_per_doc` is refused: SIE cuts pairs at the model's length.
- embed: `texts`, `input_type` (`search_query` marks them as queries; `search_document`, `classification`,
  `clustering` as documents), `embedding_types` (float, int8, uint8, binary, ubinary: SIE's output dtypes, one encode
  per distinct type), `output_dimension` (Matryoshka truncation), `truncate` (`END` or `NONE`) →
  `{id, embeddings: {type: [[...]]}, texts, meta: {billed_units: {input_tokens}}, response_type}`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import attrs
import numpy as np

from sie.gateway import assembly
from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.openai import check_reply_size, check_truncation, truncated
from sie.gateway.inference import InferenceService, Served
from sie.gateway.router import LaneHints, Route
from sie.telemetry.tracing import TraceHeaders
from sie.wire.http import EncodeParams, EncodeRequest, Item, ScoreRequest

INPUT_TYPES: Final = {"search_query": True, "search_document": False, "classification": False, "clustering": False}
# Cohere embedding type -> SIE output dtype.
EMBEDDING_TYPES: Final = {
    "float": "float32", "int8": "int8", "uint8": "uint8", "binary": "binary", "ubinary": "ubinary"
}  # fmt: skip
TRUNCATE: Final = {"END": True, "NONE": False}


def _object(data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise InvalidRequestError("Request body must be a JSON object")
    return data


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if type(model) is not str or not model:
        raise InvalidRequestError("Field 'model' is required and must be a string", param="model")
    return model


@attrs.frozen
class RerankCall:
    """A parsed Cohere/Jina rerank request."""

    model: str
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = False

    def score_request(self) -> ScoreRequest:
        items = [Item(id=str(index), text=text) for index, text in enumerate(self.documents)]
        return ScoreRequest(query=Item(text=self.query), items=items)


def _document_text(document: Any) -> str | None:
    if type(document) is str:
        return document
    if type(document) is dict and type(document.get("text")) is str:
        return document["text"]
    return None


def parse_rerank(data: Any, return_documents_default: bool) -> RerankCall:
    data = _object(data)
    model = _model(data)
    query = data.get("query")
    if type(query) is not str:
        raise InvalidRequestError("Field 'query' is required and must be a string", param="query")
    documents = data.get("documents")
    texts = [_document_text(document) for document in documents] if type(documents) is list else []
    if not texts or any(text is None for text in texts):
        raise InvalidRequestError(
            "Field 'documents' must be a non-empty list of strings or {\"text\": ...} objects", param="documents"
        )
    top_n = data.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n <= 0):
        raise InvalidRequestError(f"Field 'top_n' must be a positive integer, got {top_n!r}", param="top_n")
    if data.get("max_tokens_per_doc") is not None:
        raise InvalidRequestError(
            "max_tokens_per_doc is not supported: pairs are cut at the model's length", param="max_tokens_per_doc"
        )
    return_documents = data.get("return_documents", return_documents_default)
    if type(return_documents) is not bool:
        raise InvalidRequestError("Field 'return_documents' must be true or false", param="return_documents")
    return RerankCall(model, query, texts, top_n, return_documents)  # type: ignore[arg-type]


async def rerank(service: InferenceService, call: RerankCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    collected = await service.score_results(call.model, call.score_request(), hints, trace)
    ranked = sorted(assembly.decode_result(collected.results[0]), key=lambda entry: -entry["score"])
    results = []
    for entry in ranked[: call.top_n]:
        index = int(entry["item_id"])
        row: dict[str, Any] = {"index": index, "relevance_score": float(entry["score"])}
        if call.return_documents:
            row["document"] = {"text": call.documents[index]}
        results.append(row)
    tokens = assembly.input_tokens(collected.results)
    body = {
        "id": collected.meta.request_id,
        "model": collected.route.model,
        "results": results,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        "usage": {"total_tokens": tokens},
    }
    return Served(body, collected.meta)


@attrs.frozen
class EmbedCall:
    """A parsed Cohere v2 embed request."""

    model: str
    texts: list[str]
    is_query: bool
    embedding_types: tuple[str, ...] = ("float",)
    output_dimension: int | None = None
    truncate: bool = True

    def encode_request(self, output_dtype: str) -> EncodeRequest:
        options = {"is_query": self.is_query, "truncate": self.truncate}
        params = EncodeParams(output_types=["dense"], output_dtype=output_dtype, options=options)
        return EncodeRequest(items=[Item(text=text) for text in self.texts], params=params)


def parse_embed(data: Any) -> EmbedCall:
    data = _object(data)
    model = _model(data)
    texts = data.get("texts")
    if type(texts) is not list or not texts or not all(type(text) is str for text in texts):
        raise InvalidRequestError("Field 'texts' must be a non-empty list of strings", param="texts")
    input_type = data.get("input_type")
    if input_type not in INPUT_TYPES:
        raise InvalidRequestError(f"Field 'input_type' must be one of {sorted(INPUT_TYPES)}", param="input_type")
    types = data.get("embedding_types") or ["float"]
    if type(types) is not list or not set(types) <= set(EMBEDDING_TYPES):
        raise InvalidRequestError(
            f"Field 'embedding_types' must be a list of {sorted(EMBEDDING_TYPES)}", param="embedding_types"
        )
    dimension = data.get("output_dimension")
    if dimension is not None and (type(dimension) is not int or dimension <= 0):
        raise InvalidRequestError("Field 'output_dimension' must be a positive integer", param="output_dimension")
    truncate = data.get("truncate", "END")
    if truncate not in TRUNCATE:
        raise InvalidRequestError(f"Field 'truncate' must be one of {sorted(TRUNCATE)}", param="truncate")
    return EmbedCall(model, texts, INPUT_TYPES[input_type], tuple(dict.fromkeys(types)), dimension, TRUNCATE[truncate])


def _vector(decoded: dict[str, Any], kind: str, dimension: int | None) -> Any:
    values = np.asarray(decoded["dense"]["values"])
    if kind == "float" and dimension is not None and dimension < len(values):
        return truncated(values.astype(np.float32), dimension)
    return values if kind == "float" else values.astype(np.int64)


async def embed(service: InferenceService, call: EmbedCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    """One encode per distinct embedding type (each is an SIE output dtype), every item required."""
    if call.output_dimension is not None and call.embedding_types != ("float",):
        raise InvalidRequestError("output_dimension applies to float embeddings only", param="output_dimension")

    def check(route: Route) -> None:
        check_truncation(call.output_dimension, call.model, route.config, "output_dimension")

    collected_all = await asyncio.gather(
        *(
            service.encode_results(call.model, call.encode_request(EMBEDDING_TYPES[kind]), hints, trace, check)
            for kind in call.embedding_types
        )
    )
    embeddings: dict[str, Any] = {}
    for kind, collected in zip(call.embedding_types, collected_all, strict=True):
        assembly.check_failures(collected.results, strict=True)
        check_reply_size(collected.results)
        embeddings[kind] = [
            _vector(assembly.decode_result(result), kind, call.output_dimension) for result in collected.results
        ]
    first = collected_all[0]
    tokens = assembly.input_tokens(first.results)
    body = {
        "id": first.meta.request_id,
        "embeddings": embeddings,
        "texts": call.texts,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
        "response_type": "embeddings_by_type",
    }
    return Served(body, first.meta)
