"""Turn successful encode, score, extract and model responses into sie-sdk's result dicts (contracts Part B §2.2),
and stamp each result with the request-scoped metadata its response headers carry, as sie-sdk does.

Bodies are msgpack (ndarrays from sentinel maps) or JSON (arrays become ndarrays here); pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sie.client.errors import IncompleteBatchError, RequestError
from sie.wire import DecodeError, loads_json, unpackb
from sie.wire.http import UNIT_HEADERS

# JSON carries numbers without a dtype; the entry's `dtype` field names it (binary values are packed bytes).
_JSON_DTYPES: Mapping[str, Any] = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.float32,
    "int8": np.int8,
    "uint8": np.uint8,
    "binary": np.uint8,
    "ubinary": np.uint8,
}
_EXTRACT_LISTS = ("entities", "relations", "classifications", "objects")
# The gateway's id for the request (the one its logs and traces carry); the units it metered are `UNIT_HEADERS`.
REQUEST_ID_HEADER = "x-sie-request-id"
_MAX_REQUEST_ID_LENGTH = 256
_MAX_METER = (1 << 64) - 1


def decode_body(status_code: int, headers: Mapping[str, str], content: bytes, *, what: str) -> dict[str, Any]:
    """Decode a 2xx body into a map: msgpack when the content-type names msgpack, JSON otherwise."""
    if not 200 <= status_code < 300:
        raise RequestError(f"Unexpected {what} HTTP response (status={status_code})", status_code=status_code)
    kind = "MessagePack" if "msgpack" in headers.get("content-type", "") else "JSON"
    try:
        data = unpackb(content) if kind == "MessagePack" else loads_json(content)
    except DecodeError:
        data = None
    if not isinstance(data, dict):
        # The body itself stays out of the message: it may be large or hold user data.
        raise RequestError(f"Malformed {what} {kind} response ({len(content)} bytes)", status_code=status_code)
    return data


def attach_request_metadata(results: Any, headers: Mapping[str, str]) -> None:
    """Set `request` on each result dict (a list's or a single one) to what the response headers say of the whole
    request: `id` (visible ASCII, at most 256 characters) and `usage` (each meter a plain non-negative integer); a
    malformed value is left out, and with nothing left no `request` is set (sie-sdk's RequestMetadata)."""
    metadata: dict[str, Any] = {}
    request_id = headers.get(REQUEST_ID_HEADER)
    if request_id and _is_request_id(request_id):
        metadata["id"] = request_id
    usage = {name: int(value) for name, header in UNIT_HEADERS.items() if _is_meter(value := headers.get(header))}
    if usage:
        metadata["usage"] = usage
    if not metadata:
        return
    for result in results if isinstance(results, list) else [results]:
        if isinstance(result, dict):  # each its own copy
            result["request"] = {
                key: dict(value) if isinstance(value, dict) else value for key, value in metadata.items()
            }


def _is_request_id(value: str) -> bool:
    return len(value) <= _MAX_REQUEST_ID_LENGTH and value == value.strip() and value.isascii() and value.isprintable()


def _is_meter(value: str | None) -> bool:
    """A canonical non-negative decimal that fits 64 bits."""
    if not value or not value.isascii() or not value.isdigit() or (value[0] == "0" and value != "0"):
        return False
    return int(value) <= _MAX_METER


def parse_encode(data: Mapping[str, Any], *, model: str, submitted: int) -> list[dict[str, Any]]:
    """Encode results: `dense`/`multivector` ndarrays, `sparse` as `{indices, values}`, `timing` copied into each."""
    results = _parse_items(_encode_result, data, "encode")
    for result in results:
        _stamp_model(result, data)
        if data.get("timing"):
            result["timing"] = data["timing"]
    check_result_count(results, submitted=submitted, model=model, operation="encode")
    return results


def _encode_result(item: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if "id" in item:
        result["id"] = item["id"]
    if item.get("dense") is not None:
        result["dense"] = _array(item["dense"], "values")
    if item.get("sparse") is not None:
        sparse = item["sparse"]
        result["sparse"] = {"indices": _array(sparse, "indices", np.int32), "values": _array(sparse, "values")}
    if item.get("multivector") is not None:
        result["multivector"] = _matrix(item["multivector"])
    return result


def _array(entry: Mapping[str, Any], key: str, dtype: Any = None) -> np.ndarray:
    values = entry[key]
    if isinstance(values, np.ndarray):
        return values
    return np.asarray(values, dtype=dtype or _JSON_DTYPES.get(entry.get("dtype", ""), np.float32))


def _matrix(entry: Mapping[str, Any]) -> np.ndarray:
    values = _array(entry, "values")
    token_dims = entry.get("token_dims")
    if values.ndim == 1 and isinstance(token_dims, int) and token_dims > 0:
        return values.reshape(-1, token_dims)
    return values


def parse_score(data: Mapping[str, Any]) -> dict[str, Any]:
    """Score result: `{model, query_id, scores: [{item_id, score, rank}]}`, best first as the server sorted it."""
    try:
        scores = [{"item_id": s["item_id"], "score": s["score"], "rank": s["rank"]} for s in data["scores"]]
        return {"model": data["model"], "query_id": data.get("query_id"), "scores": scores}
    except (KeyError, TypeError) as exc:
        raise RequestError(f"Unexpected score response shape: missing {exc}") from None


def parse_extract(data: Mapping[str, Any], *, model: str, submitted: int) -> list[dict[str, Any]]:
    """Extract results: `entities`, `relations`, `classifications`, `objects` always present; `id`, `data` if set."""
    results = _parse_items(_extract_result, data, "extract")
    for result in results:
        _stamp_model(result, data)
    check_result_count(results, submitted=submitted, model=model, operation="extract")
    return results


def _extract_result(item: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {key: list(item.get(key) or []) for key in _EXTRACT_LISTS}
    result["entities"] = [_entity(entity) for entity in result["entities"]]
    if item.get("id") is not None:
        result["id"] = item["id"]
    if item.get("data"):
        result["data"] = item["data"]
    if item.get("error") is not None:
        result["error"] = item["error"]
    return result


def _entity(entity: Mapping[str, Any]) -> dict[str, Any]:
    # start/end/bbox are optional on the wire but always keys of the SDK's Entity.
    return {**entity, "start": entity.get("start"), "end": entity.get("end"), "bbox": entity.get("bbox")}


def _parse_items(
    parse: Callable[[Mapping[str, Any]], dict[str, Any]], data: Mapping[str, Any], what: str
) -> list[dict[str, Any]]:
    items = data.get("items")
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise RequestError(f"Unexpected {what} response shape: `items` must be a list of maps")
    try:
        return [parse(item) for item in items]
    except (KeyError, TypeError, ValueError) as exc:
        raise RequestError(f"Unexpected {what} response shape: {exc!r}") from None


def _stamp_model(result: dict[str, Any], data: Mapping[str, Any]) -> None:
    # sie-sdk 0.10.1 copies the serving model's name into every result.
    if isinstance(data.get("model"), str) and data["model"]:
        result["model"] = data["model"]


def check_result_count(results: Sequence[Any], *, submitted: int, model: str, operation: str) -> None:
    """Raise IncompleteBatchError unless there is exactly one result per input (results are positional)."""
    if len(results) == submitted:
        return
    message = (
        f"{operation.capitalize()} response for model {model!r} has {len(results)} result(s) for {submitted} "
        "input item(s); an input may have failed on the server and been dropped from the batch."
    )
    raise IncompleteBatchError(
        message,
        code=f"{operation.upper()}_RESULT_COUNT_MISMATCH",
        expected=submitted,
        received=len(results),
        model=model,
        results=results,
    )


def parse_models(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `models` list of `GET /v1/models`."""
    models = data.get("models")
    if not isinstance(models, list):
        raise RequestError("Unexpected models response shape: `models` must be a list")
    return models
