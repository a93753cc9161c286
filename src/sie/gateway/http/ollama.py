"""The Ollama dialect over encode: `POST /api/embed` (`model`, `input` a string or a list, `truncate` default true,
`dimensions` as OpenAI's) → `{model, embeddings, total_duration, load_duration, prompt_eval_count}`, and the older
`POST /api/embeddings` (`model`, `prompt`) → `{embedding}`. Ollama's `keep_alive` and `options` (its runtime's
sampling and threading knobs) have no meaning here and are accepted as Ollama accepts unknown ones.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import numpy as np

from sie.gateway import assembly
from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.openai import check_reply_size, check_truncation, truncated
from sie.gateway.inference import InferenceService, Served
from sie.gateway.router import LaneHints, Route
from sie.telemetry.tracing import TraceHeaders
from sie.wire.http import EncodeParams, EncodeRequest, Item


@attrs.frozen
class EmbedCall:
    """A parsed Ollama embed request; `legacy` for `/api/embeddings` (one prompt, one `embedding`)."""

    model: str
    texts: list[str]
    truncate: bool = True
    dimensions: int | None = None
    legacy: bool = False

    def encode_request(self) -> EncodeRequest:
        params = EncodeParams(output_types=["dense"], options={"truncate": self.truncate})
        return EncodeRequest(items=[Item(text=text) for text in self.texts], params=params)


def _object(data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise InvalidRequestError("Request body must be a JSON object")
    model = data.get("model")
    if type(model) is not str or not model:
        raise InvalidRequestError("Field 'model' is required and must be a string", param="model")
    return data


def parse_embed(data: Any) -> EmbedCall:
    data = _object(data)
    value = data.get("input")
    texts = [value] if type(value) is str else value
    if type(texts) is not list or not texts or not all(type(text) is str for text in texts):
        raise InvalidRequestError("Field 'input' must be a string or a non-empty list of strings", param="input")
    truncate = data.get("truncate", True)
    if type(truncate) is not bool:
        raise InvalidRequestError("Field 'truncate' must be true or false", param="truncate")
    dimensions = data.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions <= 0):
        raise InvalidRequestError("Field 'dimensions' must be a positive integer", param="dimensions")
    return EmbedCall(data["model"], texts, truncate, dimensions)


def parse_embeddings(data: Any) -> EmbedCall:
    data = _object(data)
    prompt = data.get("prompt")
    if type(prompt) is not str:
        raise InvalidRequestError("Field 'prompt' is required and must be a string", param="prompt")
    return EmbedCall(data["model"], [prompt], legacy=True)


async def embed(service: InferenceService, call: EmbedCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    started = time.perf_counter_ns()

    def check(route: Route) -> None:
        check_truncation(call.dimensions, call.model, route.config)

    collected = await service.encode_results(call.model, call.encode_request(), hints, trace, check)
    assembly.check_failures(collected.results, strict=True)
    check_reply_size(collected.results)
    vectors = []
    for result in collected.results:
        values = np.asarray(assembly.decode_result(result)["dense"]["values"], dtype=np.float32)
        if call.dimensions and call.dimensions < len(values):
            values = truncated(values, call.dimensions)
        vectors.append(values)
    if call.legacy:
        return Served({"embedding": vectors[0]}, collected.meta)
    body = {
        "model": call.model,
        "embeddings": vectors,
        "total_duration": time.perf_counter_ns() - started,
        "load_duration": 0,
        "prompt_eval_count": assembly.input_tokens(collected.results),
    }
    return Served(body, collected.meta)
