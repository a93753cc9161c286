"""The KServe V2 / Open Inference Protocol over gRPC: `inference.GRPCInferenceService` on its own port
(SIE_GATEWAY_GRPC_PORT, with the `grpc` extra), so Triton's gRPC client and perf tools work unchanged. It answers
what the HTTP routes answer (kserve.py), through the same inference service, catalogue, readiness and bearer tokens:

- ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata; ModelInfer with BYTES inputs `text` (and
  `query` to score), from `contents.bytes_contents` or `raw_input_contents` (Triton's client sends the latter),
  answering FP32 `dense` `[n, dim]` or `scores` `[n]` in `raw_output_contents`. Request `parameters` are SIE's
  options, as over HTTP. The protocol's other calls (streaming, repository, shared memory) answer UNIMPLEMENTED.
- Metadata `authorization: Bearer …` as the HTTP routes need it; `x-sie-pool`, `x-sie-machine-profile` and
  `traceparent` as their headers.
- Failures are gRPC statuses mapped from the HTTP ones (400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403
  PERMISSION_DENIED, 404 NOT_FOUND, 413/429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, else
  INTERNAL) with the message, and the SIE code and `retry-after` in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import attrs
import numpy as np

from sie.gateway.errors import InvalidRequestError, ShuttingDownError
from sie.gateway.http import kserve_messages as messages
from sie.gateway.http.auth import GatewayAuth
from sie.gateway.http.headers import ERROR_CODE, RETRY_AFTER, SIE_VERSION
from sie.gateway.http.kserve import (
    MODEL_VERSION,
    Tensor,
    bytes_elements,
    infer,
    infer_call,
    model_metadata,
    resolve_model,
)
from sie.gateway.http.replies import Surface, error_reply
from sie.gateway.http.shutdown import ServingState
from sie.gateway.inference import InferenceService
from sie.gateway.router import CatalogSource, LaneHints
from sie.telemetry.requests import CLIENT_CLOSED, Observation, RequestObserver
from sie.telemetry.tracing import TRACEPARENT, TRACESTATE, trace_headers

logger = logging.getLogger(__name__)

# Where an HTTP status of the same failure maps to, by the gRPC status code's name.
STATUS_CODES: Final = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "FAILED_PRECONDITION", 413: "RESOURCE_EXHAUSTED", 422: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}  # fmt: skip
GRACE_S: Final = 5.0  # how long in-flight calls may finish when the server stops

Authorize = Callable[[str | None], None]  # raises UnauthorizedError / ForbiddenError for the `authorization` value


def grpc_authorizer(auth: GatewayAuth) -> Authorize | None:
    """The bearer check of every call: the HTTP inference routes' (None when auth is off)."""
    if not auth.enforcing:
        return None
    return lambda header: auth.authorize("POST", f"/{messages.SERVICE}", header)


class GrpcUnavailable(RuntimeError):
    """SIE_GATEWAY_GRPC_PORT is set but grpcio is not installed."""


def _grpc() -> Any:
    try:
        import grpc  # the `grpc` extra: imported only when the port is set
    except ImportError as exc:
        raise GrpcUnavailable(
            "SIE_GATEWAY_GRPC_PORT is set, but grpcio is not installed: pip install 'sie[grpc]'"
        ) from exc
    return grpc


def _parameter(value: Any) -> Any:
    """An InferParameter's value (the one of its fields that is set)."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def _tensors(request: Any) -> list[Tensor]:
    """The request's BYTES inputs, decoded to texts (raw contents, when sent, are the inputs' data in order)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequestError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
    tensors = []
    for index, entry in enumerate(request.inputs):
        if entry.datatype != "BYTES":
            raise InvalidRequestError(f"Input '{entry.name}' must be BYTES (text), not {entry.datatype or 'unset'}")
        if raw:
            texts = bytes_elements(raw[index])
        else:
            try:
                texts = [value.decode("utf-8", errors="strict") for value in entry.contents.bytes_contents]
            except UnicodeDecodeError as exc:
                raise InvalidRequestError("BYTES tensor data is not UTF-8 text") from exc
        shape = list(entry.shape)
        if int(np.prod(shape or [0])) != len(texts):
            raise InvalidRequestError(f"Input '{entry.name}' shape {shape} does not hold {len(texts)} elements")
        tensors.append(Tensor(entry.name, "BYTES", shape, texts))
    if not tensors:
        raise InvalidRequestError("An inference request needs at least one input")
    return tensors


@attrs.frozen
class _GrpcRoute:
    """What the request observers read of a matched route: its path template (the metrics' route label)."""

    path: str


def _client(peer: str) -> tuple[str, int] | None:
    """`ipv4:127.0.0.1:5000` (gRPC's peer string) as an ASGI client pair; None for another kind."""
    kind, _, address = peer.partition(":")
    host, _, port = address.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


class KServeGrpc:
    """The gRPC service over `service`; `start(host, port)` serves it until `stop()`. Its calls count as the
    gateway's in-flight requests (`serving`): a draining gateway refuses new ones (UNAVAILABLE) and waits for these."""

    def __init__(  # noqa: PLR0913 - the HTTP routes' collaborators and the message size limit
        self,
        service: InferenceService,
        catalog: CatalogSource,
        serving: ServingState,
        ready: Callable[[], bool],
        authorize: Authorize | None,
        max_message_bytes: int,
        observers: Sequence[RequestObserver] = (),
    ) -> None:
        self._service = service
        self._catalog = catalog
        self._serving = serving
        self._ready = ready
        self._authorize = authorize
        self._max_message_bytes = max_message_bytes
        self._observers = tuple(observers)
        self._server: Any = None

    async def start(self, host: str, port: int) -> int:
        """Listen on `host:port` (0 picks a free port); the port bound."""
        grpc = _grpc()
        limits = [("grpc.max_receive_message_length", self._max_message_bytes),
                  ("grpc.max_send_message_length", self._max_message_bytes)]  # fmt: skip
        server = grpc.aio.server(options=limits)
        handlers = {
            method: grpc.unary_unary_rpc_method_handler(
                self._call(method, getattr(self, f"_{method}")),
                request_deserializer=messages.message_class(request).FromString,
                response_serializer=lambda response: response.SerializeToString(),
            )
            for method, (request, _) in messages.METHODS.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(messages.SERVICE, handlers),))
        bound = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot listen for gRPC on {host}:{port}")
        await server.start()
        self._server = server
        logger.info("listening on grpc://%s:%d (KServe V2 / Open Inference Protocol)", host, bound)
        return bound

    async def stop(self, grace_s: float = GRACE_S) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    def _call(
        self, name: str, method: Callable[[Any, dict[str, str]], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        """A handler: check the caller's token, run `method`, turn a failure into its gRPC status, and tell the
        request observers (access log, request metrics, status page) as an HTTP request would, its path
        `/inference.GRPCInferenceService/{name}` and its status the HTTP one of the same outcome."""
        grpc = _grpc()
        path = f"/{messages.SERVICE}/{name}"
        route = _GrpcRoute(path)

        async def handle(request: Any, context: Any) -> Any:
            metadata = {key: value for key, value in context.invocation_metadata() if isinstance(value, str)}
            model = getattr(request, "model_name", None) or getattr(request, "name", None)
            scope = {"type": "grpc", "method": "POST", "path": path, "raw_path": path.encode(), "route": route,
                     "path_params": {"model": model} if model else {}, "client": _client(context.peer())}  # fmt: skip
            observation = Observation(scope, self._observers)
            status = 200
            self._serving.enter()
            try:
                if self._authorize is not None:
                    self._authorize(metadata.get("authorization"))
                if self._serving.draining:
                    raise ShuttingDownError("The gateway is shutting down; retry the request")
                return await method(request, metadata)
            except asyncio.CancelledError:
                status = CLIENT_CLOSED
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is answered as a status (replies.py logs bugs)
                reply = error_reply(exc, Surface.KSERVE)
                status = reply.status
                trailers = tuple((key, reply.headers[key]) for key in (ERROR_CODE, RETRY_AFTER) if key in reply.headers)
                code = getattr(grpc.StatusCode, STATUS_CODES.get(reply.status, "INTERNAL"))
                await context.abort(code, reply.body["error"], trailing_metadata=trailers)
            finally:
                self._serving.leave()
                observation.finish(status)

        return handle

    async def _ServerLive(self, request: Any, metadata: dict[str, str]) -> Any:  # noqa: N802 - the protocol's names
        return messages.ServerLiveResponse(live=True)

    async def _ServerReady(self, request: Any, metadata: dict[str, str]) -> Any:  # noqa: N802
        return messages.ServerReadyResponse(ready=bool(self._ready()))

    async def _ModelReady(self, request: Any, metadata: dict[str, str]) -> Any:  # noqa: N802
        resolve_model(self._catalog, request.name, request.version)
        return messages.ModelReadyResponse(ready=bool(self._ready()))

    async def _ServerMetadata(self, request: Any, metadata: dict[str, str]) -> Any:  # noqa: N802
        return messages.ServerMetadataResponse(name="sie", version=SIE_VERSION)

    async def _ModelMetadata(self, request: Any, metadata: dict[str, str]) -> Any:  # noqa: N802
        described = model_metadata(resolve_model(self._catalog, request.name, request.version))
        answer = messages.ModelMetadataResponse(
            name=described["name"], versions=described["versions"], platform=described["platform"]
        )
        for tensor in described["inputs"]:
            answer.inputs.add(**tensor)
        for tensor in described["outputs"]:
            answer.outputs.add(**tensor)
        return answer

    async def _ModelInfer(self, request: Any, metadata: dict[str, str]) -> Any:  # noqa: N802
        resolve_model(self._catalog, request.model_name, request.model_version)
        parameters = {key: _parameter(value) for key, value in request.parameters.items()}
        outputs = [output.name for output in request.outputs]
        call = infer_call(request.model_name, _tensors(request), parameters, outputs, request.id or None)
        hints = LaneHints(metadata.get("x-sie-pool"), metadata.get("x-sie-machine-profile"))
        trace = trace_headers(metadata.get(TRACEPARENT), metadata.get(TRACESTATE))
        served = await infer(self._service, call, hints, trace)
        body = served.body
        answer = messages.ModelInferResponse(model_name=body["model_name"], model_version=MODEL_VERSION, id=body["id"])
        for output in body["outputs"]:
            values = output["values"]
            answer.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
            answer.raw_output_contents.append(np.ascontiguousarray(values, dtype="<f4").tobytes())
        return answer
