"""The KServe V2 / Open Inference Protocol over HTTP (seed 002's front door), as Triton's clients and perf tools speak
it: server and model metadata, liveness and readiness, and `POST /v2/models/{model}[/versions/1]/infer`.

- An encode takes one BYTES input of texts (`text`, or the request's only input; shape `[n]` or `[n, 1]`) and
  answers the FP32 output `dense` `[n, dim]`; a score takes BYTES inputs `query` (one text) and `text` (the
  documents) and answers FP32 `scores` `[n]`, in document order. Sparse and multi-vector results are ragged, so they
  are refused here by name (`/v1/encode` serves them).
- The request's `parameters` carry SIE's options (`is_query`, `instruction`, `output_dtype`, `profile`, ...).
- The binary tensor data extension: a body whose JSON header is `Inference-Header-Content-Length` bytes long, each
  input's `binary_data_size` bytes following in order (BYTES elements as a 4-byte little-endian length and the
  bytes); outputs asked with `binary_data: true` (or `binary_data_output`) come back the same way.
- Errors are `{"error": message}` with the SIE code in `X-SIE-Error-Code`.
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable
from typing import Any, Final

import attrs
import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.catalog.errors import ModelNotFoundError
from sie.gateway import assembly
from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.edge import endpoint, json_response, lane_hints, response_headers
from sie.gateway.http.headers import SIE_VERSION
from sie.gateway.http.inference import InferenceHandlers
from sie.gateway.http.replies import Surface
from sie.gateway.inference import InferenceService, Served
from sie.gateway.router import CatalogSource, LaneHints
from sie.http.bodies import read_body
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import TraceHeaders, Tracing
from sie.wire.http import EncodeParams, EncodeRequest, Item, ScoreRequest

HEADER_LENGTH: Final = "Inference-Header-Content-Length"
MODEL_VERSION: Final = "1"
PARAMETER_PARAMS: Final = ("instruction", "output_dtype")  # request parameters that are encode params, not options


@attrs.frozen
class Tensor:
    """One decoded input tensor."""

    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


def _split_body(raw: bytes, header_length: str | None) -> tuple[Any, bytes]:
    if header_length is None:
        return orjson.loads(raw), b""
    if not header_length.isdigit() or int(header_length) > len(raw):
        raise InvalidRequestError(f"{HEADER_LENGTH} {header_length!r} does not fit a {len(raw)}-byte body")
    length = int(header_length)
    return orjson.loads(raw[:length]), raw[length:]


def bytes_elements(blob: bytes) -> list[str]:
    """BYTES tensor data in binary form (the HTTP extension, gRPC's raw contents): repeated (uint32 little-endian
    length, UTF-8 bytes)."""
    elements, offset = [], 0
    while offset < len(blob):
        if offset + 4 > len(blob):
            raise InvalidRequestError("BYTES tensor data ends inside an element's length")
        (size,) = struct.unpack_from("<I", blob, offset)
        offset += 4
        if offset + size > len(blob):
            raise InvalidRequestError("BYTES tensor data ends inside an element")
        try:
            elements.append(blob[offset : offset + size].decode("utf-8", errors="strict"))
        except UnicodeDecodeError as exc:
            raise InvalidRequestError("BYTES tensor data is not UTF-8 text") from exc
        offset += size
    return elements


def parse_inputs(raw: bytes, header_length: str | None) -> tuple[dict[str, Any], list[Tensor]]:
    """The request's JSON object and its input tensors (text ones decoded), binary data consumed in order."""
    try:
        data, binary = _split_body(raw, header_length)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"The inference request header is not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequestError("BYTES tensor data is not UTF-8 text") from exc
    if type(data) is not dict or type(data.get("inputs")) is not list or not data["inputs"]:
        raise InvalidRequestError("An inference request is a JSON object with a non-empty 'inputs' list")
    tensors, offset = [], 0
    for entry in data["inputs"]:
        if type(entry) is not dict or type(entry.get("name")) is not str or entry.get("datatype") != "BYTES":
            raise InvalidRequestError("Each input needs a 'name' and datatype 'BYTES' (text)")
        values, offset = _input_values(entry, binary, offset)
        shape = entry.get("shape")
        if type(shape) is not list or int(np.prod(shape or [0])) != len(values):
            raise InvalidRequestError(f"Input '{entry['name']}' shape {shape!r} does not hold {len(values)} elements")
        tensors.append(Tensor(entry["name"], "BYTES", shape, values))
    return data, tensors


def _input_values(entry: dict[str, Any], binary: bytes, offset: int) -> tuple[list[str], int]:
    """One input's texts (from its JSON `data`, or its `binary_data_size` bytes at `offset`) and the next offset."""
    size = (entry.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if type(size) is not int or size < 0 or offset + size > len(binary):
            raise InvalidRequestError(f"Input '{entry['name']}' binary_data_size {size!r} runs past the body")
        return bytes_elements(binary[offset : offset + size]), offset + size
    values = entry.get("data")
    if type(values) is list and values and type(values[0]) is list:  # [[...]] for shape [n, 1]
        values = [value for row in values for value in (row if type(row) is list else [row])]
    if type(values) is not list or not all(type(value) is str for value in values):
        raise InvalidRequestError(f"Input '{entry['name']}' data must be a list of strings")
    return values, offset


@attrs.frozen
class InferCall:
    """What one infer request asks: an encode (`query` None) or a score, the outputs it wants and how."""

    model: str
    texts: list[str]
    query: str | None
    request_id: str | None
    params: dict[str, Any]
    options: dict[str, Any]
    binary_outputs: frozenset[str] = frozenset()

    @property
    def output(self) -> str:
        return "scores" if self.query is not None else "dense"


def parse_infer(model: str, raw: bytes, header_length: str | None) -> InferCall:
    data, tensors = parse_inputs(raw, header_length)
    parameters = data.get("parameters") or {}
    if type(parameters) is not dict:
        raise InvalidRequestError("'parameters' must be an object")
    wanted = data.get("outputs") or []
    if type(wanted) is not list or not all(type(entry) is dict for entry in wanted):
        raise InvalidRequestError("'outputs' must be a list of objects with a 'name'")
    request_id = data.get("id") if type(data.get("id")) is str else None
    call = infer_call(model, tensors, parameters, [entry.get("name") for entry in wanted], request_id)
    binary = {entry["name"] for entry in wanted if (entry.get("parameters") or {}).get("binary_data") is True}
    if parameters.get("binary_data_output") is True:
        binary.add(call.output)
    return attrs.evolve(call, binary_outputs=frozenset(binary))


def infer_call(
    model: str, tensors: list[Tensor], parameters: dict[str, Any], outputs: list[Any], request_id: str | None
) -> InferCall:
    """An infer request as SIE serves it, from its decoded parts (HTTP's JSON or gRPC's messages): a `text` input
    (or the only one) to encode, with a one-text `query` input to score against; `outputs` the names asked for."""
    by_name = {tensor.name: tensor for tensor in tensors}
    query = by_name.pop("query", None)
    if query is not None and len(query.data) != 1:
        raise InvalidRequestError("Input 'query' holds exactly one text")
    texts = by_name.pop("text", None) or (by_name.popitem()[1] if len(by_name) == 1 else None)
    if texts is None or by_name:
        raise InvalidRequestError("Send one BYTES input 'text' (and 'query' to score the texts against it)")
    if not texts.data:
        raise InvalidRequestError(f"Input '{texts.name}' holds no texts")
    expected = "scores" if query is not None else "dense"
    for name in outputs:
        if name != expected:
            raise InvalidRequestError(
                f"Output {name!r} is not served here: an encode answers 'dense' (sparse and multi-vector results "
                f"are ragged: use /v1/encode), a score 'scores'"
            )
    params = {key: parameters[key] for key in PARAMETER_PARAMS if key in parameters}
    options = {key: value for key, value in parameters.items() if key not in {*PARAMETER_PARAMS, "binary_data_output"}}
    return InferCall(model, texts.data, query.data[0] if query else None, request_id, params, options)


async def infer(service: InferenceService, call: InferCall, hints: LaneHints, trace: TraceHeaders | None) -> Served:
    if call.query is None:
        params = EncodeParams(output_types=["dense"], options=call.options or None, **call.params)
        request = EncodeRequest(items=[Item(text=text) for text in call.texts], params=params)
        collected = await service.encode_results(call.model, request, hints, trace)
        assembly.check_failures(collected.results, strict=True)
        rows = [np.asarray(assembly.decode_result(r)["dense"]["values"], dtype=np.float32) for r in collected.results]
        values = np.stack(rows)
    else:
        items = [Item(id=str(index), text=text) for index, text in enumerate(call.texts)]
        score = ScoreRequest(query=Item(text=call.query), items=items, options=call.options or None,
                             instruction=call.params.get("instruction"))  # fmt: skip
        collected = await service.score_results(call.model, score, hints, trace)
        values = np.zeros(len(call.texts), dtype=np.float32)
        for entry in assembly.decode_result(collected.results[0]):
            values[int(entry["item_id"])] = entry["score"]
    output = {"name": call.output, "datatype": "FP32", "shape": list(values.shape), "values": values}
    body = {"model_name": collected.route.model, "model_version": MODEL_VERSION,
            "id": call.request_id or collected.meta.request_id, "outputs": [output]}  # fmt: skip
    return Served(body, collected.meta)


def render(served: Served, binary_outputs: frozenset[str], started: float) -> Response:
    """JSON outputs, or the binary extension for the outputs asked for as binary data."""
    body, blobs = dict(served.body), []
    outputs = []
    for output in body["outputs"]:
        values = output.pop("values")
        if output["name"] in binary_outputs:
            blob = np.ascontiguousarray(values, dtype="<f4").tobytes()
            outputs.append({**output, "parameters": {"binary_data_size": len(blob)}})
            blobs.append(blob)
        else:
            outputs.append({**output, "data": values.reshape(-1).tolist()})
    header = orjson.dumps({**body, "outputs": outputs})
    headers = response_headers(served.meta, (time.perf_counter() - started) * 1e3)
    if not blobs:
        return Response(header, media_type="application/json", headers=headers)
    headers[HEADER_LENGTH] = str(len(header))
    return Response(header + b"".join(blobs), media_type="application/octet-stream", headers=headers)


def resolve_model(catalog: CatalogSource, name: str, version: str | None) -> Any:
    """The catalogue entry of `name` (ModelNotFoundError for an unknown one, or a version but the one there is)."""
    if version not in (None, "", MODEL_VERSION):
        raise ModelNotFoundError(name, f"Model '{name}' has only version {MODEL_VERSION}, not {version!r}")
    return catalog().resolve(name).entry


def model_metadata(entry: Any) -> dict[str, Any]:
    """A catalogue entry's model metadata: `text` in, `dense` out; `query` in and `scores` out when it scores."""
    model = entry.model
    dim = model.dims.get("dense")
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    outputs = []
    if dim is not None:
        outputs.append({"name": "dense", "datatype": "FP32", "shape": [-1, dim]})
    if model.tasks.score:
        inputs.append({"name": "query", "datatype": "BYTES", "shape": [1]})
        outputs.append({"name": "scores", "datatype": "FP32", "shape": [-1]})
    return {"name": entry.model_id, "versions": [MODEL_VERSION], "platform": "sie", "inputs": inputs,
            "outputs": outputs}  # fmt: skip


class KServeHandlers(InferenceHandlers):
    """The Open Inference Protocol routes: metadata from the catalogue, readiness from the gateway's own."""

    def __init__(
        self,
        service: InferenceService,
        max_body_bytes: int,
        tracing: Tracing | None,
        catalog: CatalogSource,
        ready: Callable[[], bool],
    ) -> None:
        super().__init__(service, max_body_bytes, tracing)
        self._catalog = catalog
        self._ready = ready

    @endpoint(Surface.KSERVE)
    async def server(self, request: Request) -> Response:
        return json_response({"name": "sie", "version": SIE_VERSION, "extensions": ["binary_tensor_data"]})

    @endpoint(Surface.KSERVE)
    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    @endpoint(Surface.KSERVE)
    async def ready(self, request: Request) -> Response:
        ready = bool(self._ready())
        response = json_response({"ready": ready})
        response.status_code = 200 if ready else 503
        return response

    def _model(self, request: Request) -> Any:
        return resolve_model(self._catalog, request.path_params["model"], request.path_params.get("version"))

    @endpoint(Surface.KSERVE)
    async def model(self, request: Request) -> Response:
        return json_response(model_metadata(self._model(request)))

    @endpoint(Surface.KSERVE)
    async def model_ready(self, request: Request) -> Response:
        self._model(request)
        response = json_response({"name": request.path_params["model"], "ready": bool(self._ready())})
        response.status_code = 200 if self._ready() else 503
        return response

    @endpoint(Surface.KSERVE)
    async def infer_route(self, request: Request) -> Response:
        started = time.perf_counter()
        self._model(request)
        raw = await read_body(request, self._max_body_bytes)
        call = parse_infer(request.path_params["model"], raw, request.headers.get(HEADER_LENGTH))
        note_request(model=call.model, items=len(call.texts))
        work = functools.partial(infer, self._service, call, lane_hints(request))
        return render(await self._serve(request, work, call.model), call.binary_outputs, started)


def kserve_routes(handlers: KServeHandlers) -> list[Route]:
    versioned = "/v2/models/{model:path}/versions/{version}"
    return [
        Route("/v2", handlers.server, methods=["GET"]),
        Route("/v2/health/live", handlers.live, methods=["GET"]),
        Route("/v2/health/ready", handlers.ready, methods=["GET"]),
        Route(f"{versioned}/infer", handlers.infer_route, methods=["POST"]),
        Route(f"{versioned}/ready", handlers.model_ready, methods=["GET"]),
        Route(versioned, handlers.model, methods=["GET"]),
        Route("/v2/models/{model:path}/infer", handlers.infer_route, methods=["POST"]),
        Route("/v2/models/{model:path}/ready", handlers.model_ready, methods=["GET"]),
        Route("/v2/models/{model:path}", handlers.model, methods=["GET"]),
    ]
