"""The Text Embeddings Inference (TEI) dialect over encode and score: the request fields and answer shapes of TEI's
`/embed`, `/embed_sparse`, `/embed_all`, `/rerank`, `/info` and its root route. TEI serves one model per process and its
clients take a base URL, so here the base URL names the model: `http://host:8080/{model}` (`/{model}/embed`,
`/{model}/rerank`, `POST /{model}` embeds). Every item must succeed, as in TEI.

- `/embed`: `inputs` (a string or a list), `normalize` (default true), `truncate` (default true here: SIE cuts long
  inputs at the model's length; false refuses them), `prompt_name` (`query` marks the inputs as queries;
  `document`/`passage` as documents), `dimensions` (Matryoshka truncation, as OpenAI's) → `[[float]]`.
- `/embed_sparse` → `[[{index, value}]]` (SPLADE, BGE-M3); `/embed_all` → `[[[float]]]`, one vector per token (a
  multi-vector model or variant: `/{model}:multivector/embed_all`).
- `/rerank`: `query`, `texts`, `return_text`; `raw_scores` true and `truncate` false are refused (SIE's scores are
  the model's activated ones, and pairs are cut at the model's length) → `[{index, score, text?}]`, best first.
- `/predict`: `inputs` a `[text, text_pair]` pair or a list of them → `[[{score, label}]]` from the model's relevance
  head (a cross-encoder's one label, `LABEL_0`); a single text is refused (no single-text classifier is served).
- `/tokenize`: `inputs`, `add_special_tokens`, `prompt_name` → `[[{id, text, special, start, stop}]]`; `/decode`:
  `ids`, `skip_special_tokens` → `[text]`. The model's own tokenizer answers them on its sidecar (no worker run).
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import numpy as np

from sie.gateway import assembly
from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.headers import SIE_VERSION
from sie.gateway.http.openai import check_reply_size, check_truncation, truncated
from sie.gateway.inference import InferenceService, Served
from sie.gateway.router import LaneHints, Route
from sie.telemetry.tracing import TraceHeaders
from sie.wire.http import EncodeParams, EncodeRequest, Item, ScoreRequest
from sie.wire.queue import WorkResult

# `prompt_name` values that say which side of retrieval the inputs are.
PROMPT_ROLES: Final = {"query": True, "document": False, "passage": False}
# TEI route -> the SIE output it answers from.
EMBED_OUTPUTS: Final = {"embed": "dense", "embed_sparse": "sparse", "embed_all": "multivector"}


def _object(data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise InvalidRequestError("Request body must be a JSON object")
    return data


def _flag(data: dict[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if type(value) is not bool:
        raise InvalidRequestError(f"Field '{key}' must be true or false, got {value!r}", param=key)
    return value


def _texts(value: Any, key: str) -> list[str]:
    if type(value) is str:
        return [value]
    if type(value) is list and value and all(type(text) is str for text in value):
        return value
    raise InvalidRequestError(f"Field '{key}' must be a string or a non-empty list of strings", param=key)


@attrs.frozen
class EmbedCall:
    """A parsed TEI embed request for one of `EMBED_OUTPUTS`."""

    model: str
    output: str  # dense | sparse | multivector
    texts: list[str]
    normalize: bool = True
    truncate: bool = True
    is_query: bool | None = None
    dimensions: int | None = None

    def encode_request(self) -> EncodeRequest:
        options: dict[str, Any] = {"truncate": self.truncate}
        if self.output == "dense" and not self.normalize:
            options["normalize"] = False
        if self.is_query is not None:
            options["is_query"] = self.is_query
        params = EncodeParams(output_types=[self.output], options=options)
        return EncodeRequest(items=[Item(text=text) for text in self.texts], params=params)


def parse_embed(model: str, route: str, data: Any) -> EmbedCall:
    """A TEI embed body for `route` (`embed`, `embed_sparse`, `embed_all`)."""
    data = _object(data)
    prompt = data.get("prompt_name")
    if prompt is not None and prompt not in PROMPT_ROLES:
        raise InvalidRequestError(
            f"Field 'prompt_name' must be one of {sorted(PROMPT_ROLES)}, got {prompt!r}", param="prompt_name"
        )
    direction = data.get("truncation_direction", "Right")
    if direction not in ("Right", "right"):
        raise InvalidRequestError("Only truncation_direction 'Right' is supported", param="truncation_direction")
    dimensions = data.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions <= 0):
        raise InvalidRequestError(f"Field 'dimensions' must be a positive integer, got {dimensions!r}")
    return EmbedCall(
        model=model,
        output=EMBED_OUTPUTS[route],
        texts=_texts(data.get("inputs"), "inputs"),
        normalize=_flag(data, "normalize", True),
        truncate=_flag(data, "truncate", True),
        is_query=None if prompt is None else PROMPT_ROLES[prompt],
        dimensions=dimensions,
    )


def _embedding(call: EmbedCall, decoded: dict[str, Any]) -> Any:
    if call.output == "sparse":
        sparse = decoded["sparse"]
        return [{"index": int(index), "value": float(value)} for index, value in zip(sparse["indices"],
                sparse["values"], strict=True)]  # fmt: skip
    if call.output == "multivector":
        return np.asarray(decoded["multivector"]["values"], dtype=np.float32)
    values = np.asarray(decoded["dense"]["values"], dtype=np.float32)
    return truncated(values, call.dimensions) if call.dimensions and call.dimensions < len(values) else values


async def embed(service: InferenceService, call: EmbedCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    """TEI's embed family: one encode, every item required, answered as a bare list."""

    def check(route: Route) -> None:
        check_truncation(call.dimensions, call.model, route.config)

    collected = await service.encode_results(call.model, call.encode_request(), hints, trace, check)
    assembly.check_failures(collected.results, strict=True)
    check_reply_size(collected.results)
    body = [_embedding(call, assembly.decode_result(result)) for result in collected.results]
    return Served(body, collected.meta)


@attrs.frozen
class RerankCall:
    """A parsed TEI rerank request."""

    model: str
    query: str
    texts: list[str]
    return_text: bool = False

    def score_request(self) -> ScoreRequest:
        items = [Item(id=str(index), text=text) for index, text in enumerate(self.texts)]
        return ScoreRequest(query=Item(text=self.query), items=items)


def parse_rerank(model: str, data: Any) -> RerankCall:
    data = _object(data)
    query = data.get("query")
    if type(query) is not str:
        raise InvalidRequestError("Field 'query' is required and must be a string", param="query")
    if _flag(data, "raw_scores", False):
        raise InvalidRequestError("raw_scores is not supported: scores are the model's own activated relevance")
    if not _flag(data, "truncate", True):
        raise InvalidRequestError("truncate false is not supported when reranking: pairs are cut at the model's length")
    texts = data.get("texts")
    if type(texts) is not list or not texts or not all(type(text) is str for text in texts):
        raise InvalidRequestError("Field 'texts' must be a non-empty list of strings", param="texts")
    return RerankCall(model, query, texts, _flag(data, "return_text", False))


def rerank_body(call: RerankCall, result: WorkResult) -> list[dict[str, Any]]:
    """`[{index, score, text?}]`, best first."""
    ranked = sorted(assembly.decode_result(result), key=lambda entry: -entry["score"])
    rows = []
    for entry in ranked:
        index = int(entry["item_id"])
        row: dict[str, Any] = {"index": index, "score": float(entry["score"])}
        if call.return_text:
            row["text"] = call.texts[index]
        rows.append(row)
    return rows


async def rerank(service: InferenceService, call: RerankCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    collected = await service.score_results(call.model, call.score_request(), hints, trace)
    return Served(rerank_body(call, collected.results[0]), collected.meta)


@attrs.frozen
class PredictCall:
    """A TEI `/predict` on a model that scores: `inputs` a `[text, text_pair]` pair or a list of them."""

    model: str
    pairs: list[tuple[str, str]]


def _pair(value: Any) -> tuple[str, str] | None:
    if type(value) is list and len(value) == 2 and all(type(text) is str for text in value):
        return value[0], value[1]
    return None


def parse_predict(model: str, data: Any) -> PredictCall:
    """Pairs only: SIE classifies with the model's relevance head (a cross-encoder's one label); a single text has
    no pair to score (TEI's single-text classifiers are not served)."""
    data = _object(data)
    if _flag(data, "raw_scores", False):
        raise InvalidRequestError("raw_scores is not supported: scores are the model's own activated relevance")
    if not _flag(data, "truncate", True):
        raise InvalidRequestError("truncate false is not supported: pairs are cut at the model's length")
    inputs = data.get("inputs")
    single = _pair(inputs)
    pairs = [single] if single is not None else [_pair(value) for value in inputs] if type(inputs) is list else []
    if not pairs or any(pair is None for pair in pairs):
        raise InvalidRequestError(
            "Field 'inputs' must be a [text, text_pair] pair or a non-empty list of them: SIE predicts with a "
            "model's relevance head on pairs (single-text classification is not served)",
            param="inputs",
        )
    return PredictCall(model, pairs)  # type: ignore[arg-type]


async def predict(service: InferenceService, call: PredictCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    """`[[{score, label}]]` per pair (a cross-encoder's one label, `LABEL_0`); one score request per distinct first
    text, its pairs' second texts as its documents."""
    by_query: dict[str, list[int]] = {}
    for index, (query, _) in enumerate(call.pairs):
        by_query.setdefault(query, []).append(index)
    scores = [0.0] * len(call.pairs)
    meta = None
    for query, indices in by_query.items():
        items = [Item(id=str(index), text=call.pairs[index][1]) for index in indices]
        collected = await service.score_results(call.model, ScoreRequest(query=Item(text=query), items=items), hints,
                                                trace)  # fmt: skip
        meta = meta or collected.meta
        for entry in assembly.decode_result(collected.results[0]):
            scores[int(entry["item_id"])] = float(entry["score"])
    return Served([[{"score": score, "label": "LABEL_0"}] for score in scores], meta)


@attrs.frozen
class TokenizeCall:
    """A TEI `/tokenize`: `inputs` (a string or a list), `add_special_tokens` (default true), `prompt_name`."""

    model: str
    texts: list[str]
    add_special_tokens: bool = True
    is_query: bool = False


def parse_tokenize(model: str, data: Any) -> TokenizeCall:
    data = _object(data)
    prompt = data.get("prompt_name")
    if prompt is not None and prompt not in PROMPT_ROLES:
        raise InvalidRequestError(
            f"Field 'prompt_name' must be one of {sorted(PROMPT_ROLES)}, got {prompt!r}", param="prompt_name"
        )
    texts = _texts(data.get("inputs"), "inputs")
    return TokenizeCall(model, texts, _flag(data, "add_special_tokens", True), bool(prompt and PROMPT_ROLES[prompt]))


async def tokenize(
    service: InferenceService, call: TokenizeCall, hints: LaneHints, trace: TraceHeaders | None
) -> Served:
    """`[[{id, text, special, start, stop}]]`: one token list per input, as the model reads it (cut at its length);
    `start`/`stop` are character offsets (TEI counts bytes: the same for ASCII text), None for special tokens."""
    options = {"add_special_tokens": call.add_special_tokens}
    return await service.tokenize(call.model, call.texts, options, hints, trace, is_query=call.is_query)


@attrs.frozen
class DecodeCall:
    """A TEI `/decode`: `ids` (one id list, or a list of them), `skip_special_tokens` (default true)."""

    model: str
    sequences: list[list[int]]
    skip_special_tokens: bool = True


def parse_decode(model: str, data: Any) -> DecodeCall:
    data = _object(data)
    ids = data.get("ids")
    if type(ids) is list and ids and all(type(token) is int for token in ids):
        sequences = [ids]
    elif type(ids) is list and ids and all(type(row) is list and all(type(t) is int for t in row) for row in ids):
        sequences = ids
    else:
        raise InvalidRequestError("Field 'ids' must be a non-empty list of token ids, or a list of them", param="ids")
    return DecodeCall(model, sequences, _flag(data, "skip_special_tokens", True))


async def decode(service: InferenceService, call: DecodeCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    """`[text]`, one per id list (TEI answers a list for a single list of ids too)."""
    return await service.decode(
        call.model, call.sequences, {"skip_special_tokens": call.skip_special_tokens}, hints, trace
    )


def info_body(model_id: str, model: Any, pooling: str | None, max_client_batch_size: int) -> dict[str, Any]:
    """TEI's `/info` for a catalogue model: its kind (`embedding` with its pooling, or `reranker`), its input
    length and batch limits."""
    model_type: dict[str, Any] = (
        {"embedding": {"pooling": pooling or "mean"}} if model.tasks.encode else {"reranker": {"id2label": {}}}
    )
    return {
        "model_id": model_id,
        "model_sha": None,
        "model_dtype": "float32",
        "model_type": model_type,
        "max_input_length": model.max_sequence_length,
        "max_client_batch_size": max_client_batch_size,
        "version": SIE_VERSION,
    }
