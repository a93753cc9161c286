"""The placement control surface (seed 002 "Runtime scheduling control" and "Observability") as one
framework-free async handler: `GET /v1/placement`, `POST /v1/placement/models/{model}`,
`POST /v1/placement/policy` and `POST /v1/placement/repack?wait=S` (placement's series are served on the role's
`/metrics` by `sie.placement.metrics.PlacementCollector`).

The sidecar's probe server and the `all` role's gateway app both serve `PlacementApi.handle`; this module knows
neither and imports no web framework. Errors map to the `{"error": {"code", "message"}}` envelope in one place,
`error_response`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import attrs
import orjson

from sie.placement.policy import ModelOverride, PlacementPolicy, PolicyError
from sie.placement.snapshot import ChildState, ModelPlacement, PlacementSnapshot, RepackRecord

PLACEMENT_PATH: Final = "/v1/placement"
MODELS_PREFIX: Final = "/v1/placement/models/"
POLICY_PATH: Final = "/v1/placement/policy"
REPACK_PATH: Final = "/v1/placement/repack"
# Every path this handler answers starts with one of these (a server mounts each prefix and `prefix/...`).
PATH_PREFIXES: Final = (PLACEMENT_PATH,)

JSON_CONTENT_TYPE: Final = "application/json"
MAX_BODY_BYTES: Final = 64 * 1024
MAX_WAIT_S: Final = 300.0
MODEL_FIELDS: Final = ("replicas", "fill_mode", "fill_factor")

BAD_REQUEST: Final = "bad_request"
NOT_FOUND: Final = "not_found"
METHOD_NOT_ALLOWED: Final = "method_not_allowed"
MODE_CONFLICT: Final = "mode_conflict"
PAYLOAD_TOO_LARGE: Final = "payload_too_large"


class PlacementControl(Protocol):
    """What the surface drives: the sidecar's fleet (or the `all` role's children) implements it."""

    def snapshot(self) -> PlacementSnapshot: ...

    def set_model(
        self,
        model_id: str,
        replicas: int | str | None = None,
        fill_mode: str | None = None,
        fill_factor: float | None = None,
    ) -> ModelOverride:
        """Override one model's replicas, fill mode or fill factor, in force from the next repack.
        Raises PolicyError on a bad value."""
        ...

    def set_policy(self, knobs: Mapping[str, object]) -> PlacementPolicy:
        """Change fleet-wide knobs (all but `mode`); raises PolicyError on a bad name or value."""
        ...

    async def repack(self, wait_s: float) -> RepackRecord | None:
        """Repack now, waiting up to `wait_s` for new replicas to be ready; None when the mode is not
        lpt_packing."""
        ...


@attrs.frozen
class ApiResponse:
    """One answer: HTTP status, content type and body bytes."""

    status: int
    content_type: str
    body: bytes


class ApiError(Exception):
    """A request the surface refuses, with its HTTP status and error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def error_response(exc: ApiError | PolicyError) -> ApiResponse:
    """The one mapping from a refusal to the `{"error": {"code", "message"}}` envelope."""
    if isinstance(exc, ApiError):
        status, code, message = exc.status, exc.code, exc.message
    else:  # the policy refused a knob name or value: the caller's mistake
        status, code, message = 400, BAD_REQUEST, str(exc)
    return json_response(status, {"error": {"code": code, "message": message}})


def json_response(status: int, document: Any) -> ApiResponse:
    return ApiResponse(status, JSON_CONTENT_TYPE, orjson.dumps(document))


Endpoint = Callable[[str, Mapping[str, str], bytes], Awaitable[ApiResponse]]


class PlacementApi:
    """Answers the placement paths for one PlacementControl; `handle` returns None for any other path."""

    def __init__(self, control: PlacementControl) -> None:
        self._control = control

    async def handle(self, method: str, path: str, query: Mapping[str, str], body: bytes) -> ApiResponse | None:
        """The answer to one request (a server passes HEAD as GET), or None when `path` is not a placement path."""
        if not any(path == prefix or path.startswith(prefix + "/") for prefix in PATH_PREFIXES):
            return None
        try:
            endpoint = self._endpoint(method, path)
            if len(body) > MAX_BODY_BYTES:
                raise ApiError(413, PAYLOAD_TOO_LARGE, f"the body is over the {MAX_BODY_BYTES} byte limit")
            return await endpoint(path, query, body)
        except (ApiError, PolicyError) as exc:
            return error_response(exc)

    def _endpoint(self, method: str, path: str) -> Endpoint:
        routes: dict[str, tuple[str, Endpoint]] = {
            PLACEMENT_PATH: ("GET", self._status),
            POLICY_PATH: ("POST", self._set_policy),
            REPACK_PATH: ("POST", self._repack),
        }
        if path.startswith(MODELS_PREFIX) and len(path) > len(MODELS_PREFIX):
            allowed, endpoint = "POST", self._set_model
        elif path in routes:
            allowed, endpoint = routes[path]
        else:
            raise ApiError(404, NOT_FOUND, f"no placement resource at {path}")
        if method != allowed:
            raise ApiError(405, METHOD_NOT_ALLOWED, f"{path} answers {allowed}, not {method}")
        return endpoint

    async def _status(self, path: str, query: Mapping[str, str], body: bytes) -> ApiResponse:
        return json_response(200, snapshot_document(self._control.snapshot()))

    async def _set_model(self, path: str, query: Mapping[str, str], body: bytes) -> ApiResponse:
        model_id = path[len(MODELS_PREFIX) :]
        fields = _json_object(body)
        unknown = sorted(set(fields) - set(MODEL_FIELDS))
        if unknown:
            raise ApiError(400, BAD_REQUEST, f"unknown field(s) {unknown}; accepted: {', '.join(MODEL_FIELDS)}")
        override = self._control.set_model(
            model_id,
            replicas=_replicas(fields.get("replicas")),
            fill_mode=_optional(fields, "fill_mode", str),
            fill_factor=_number(fields.get("fill_factor")),
        )
        return json_response(200, {"model": model_id, "override": attrs.asdict(override), "effective": "next repack"})

    async def _set_policy(self, path: str, query: Mapping[str, str], body: bytes) -> ApiResponse:
        return json_response(200, policy_document(self._control.set_policy(_json_object(body))))

    async def _repack(self, path: str, query: Mapping[str, str], body: bytes) -> ApiResponse:
        record = await self._control.repack(_wait_s(query.get("wait")))
        if record is None:
            mode = self._control.snapshot().policy.mode
            raise ApiError(409, MODE_CONFLICT, f"repack needs scheduling mode lpt_packing; the mode is {mode}")
        return json_response(200, repack_document(record))


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, BAD_REQUEST, f"the body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ApiError(400, BAD_REQUEST, f"expected a JSON object, got {type(document).__name__}")
    return document


def _optional(fields: Mapping[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    if value is not None and not isinstance(value, kind):
        raise ApiError(400, BAD_REQUEST, f"{name} must be a {kind.__name__}, got {value!r}")
    return value


def _replicas(value: Any) -> int | str | None:
    if value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ApiError(400, BAD_REQUEST, f"replicas must be a whole number or 'all', got {value!r}")


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, BAD_REQUEST, f"fill_factor must be a number, got {value!r}")
    return float(value)


def _wait_s(raw: str | None) -> float:
    """`?wait=S`: seconds >= 0, default 0, capped at MAX_WAIT_S."""
    if raw is None or raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, BAD_REQUEST, f"wait must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ApiError(400, BAD_REQUEST, f"wait must be a finite number of seconds >= 0, got {raw!r}")
    return min(value, MAX_WAIT_S)


def policy_document(policy: PlacementPolicy) -> dict[str, Any]:
    """Every knob of the policy, with per-model overrides (the ones set) under `models`, JSON-ready."""
    return policy.as_dict()


def repack_document(record: RepackRecord) -> dict[str, Any]:
    return attrs.asdict(record)


def snapshot_document(snapshot: PlacementSnapshot) -> dict[str, Any]:
    """The `GET /v1/placement` document."""
    policy = snapshot.policy
    return {
        "mode": policy.mode,
        "work_basis": policy.work_basis,
        "routing_policy": policy.routing_policy,
        "fill_mode": policy.routing_fill_mode,
        "policy": policy_document(policy),
        "children": [_child_document(child) for child in snapshot.children],
        "models": [_model_document(model) for model in snapshot.models],
        "repacks": {
            "total": sum(count for _, count in snapshot.repacks_total),
            "by_trigger": dict(snapshot.repacks_total),
            "last": None if snapshot.last_repack is None else repack_document(snapshot.last_repack),
        },
        "compaction": attrs.asdict(snapshot.compaction),
    }


def _child_document(child: ChildState) -> dict[str, Any]:
    return {
        "name": child.name,
        "device": child.device,
        "ready": child.ready,
        "loaded_models": list(child.loaded_models),
        "inflight": {"batches": child.inflight_batches, "items": child.inflight_items, "work": child.inflight_work},
        "memory_budget_bytes": child.memory_budget_bytes,
        "compute_seconds_total": child.compute_seconds_total,
    }


def _model_document(model: ModelPlacement) -> dict[str, Any]:
    replicas = [
        {
            "worker": replica.child,
            "device": replica.device,
            "weight": replica.weight,
            "outstanding_items": replica.outstanding_items,
            "routed_batches": replica.routed_batches,
            "routed_items": replica.routed_items,
        }
        for replica in model.replicas
    ]
    return {
        "model": model.model_id,
        "replicas_setting": model.replicas_setting,
        "replicas": replicas,
        "fill_mode": model.fill_mode,
        "fill_factor": model.fill_factor,
        "fill_quantum": model.fill_quantum,
        "demand": model.demand,
    }


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_WAIT_S",
    "PATH_PREFIXES",
    "ApiError",
    "ApiResponse",
    "PlacementApi",
    "PlacementControl",
    "error_response",
    "policy_document",
    "snapshot_document",
]
