"""The autoscaler's read of the lane signals (gateway/scaling.py), JSON for KEDA's `metrics-api` scaler:

    GET /v1/scaling/lanes                                    {"lanes": [LaneSignal, ...]}
    GET /v1/scaling/lanes/{pool}/{machine_profile}/{bundle}  one LaneSignal (zeros for a lane nobody knows)

A LaneSignal is `{pool, machine_profile, bundle, pending_demand, queue_depth, warm_floor, workers, demand}`; a
ScaledObject per lane reads `valueLocation: demand` (target: items per worker) and `valueLocation: warm_floor`
(target 1). They are operational routes, like `/metrics`: open without a token only with
SIE_AUTH_EXEMPT_OPERATIONAL.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.edge import endpoint, json_response
from sie.gateway.http.replies import Surface
from sie.gateway.scaling import LaneSignals
from sie.pools import InvalidPoolError, canonical_pool_name

SCALING_PATH = "/v1/scaling"


class ScalingHandlers:
    def __init__(self, signals: LaneSignals) -> None:
        self._signals = signals

    @endpoint(Surface.NATIVE)
    async def lanes(self, request: Request) -> Response:
        return json_response({"lanes": [signal.to_json() for signal in self._signals.lanes()]})

    @endpoint(Surface.NATIVE)
    async def lane(self, request: Request) -> Response:
        params = request.path_params
        try:
            pool, machine_profile, bundle = (
                canonical_pool_name(params[part]) for part in ("pool", "machine_profile", "bundle")
            )
        except InvalidPoolError as exc:
            raise InvalidRequestError(f"Invalid lane: {exc.message}") from exc
        return json_response(self._signals.lane((pool, machine_profile, bundle)).to_json())


def scaling_routes(signals: LaneSignals | None) -> list[Route]:
    """The `/v1/scaling` routes over `signals`; none without them."""
    if signals is None:
        return []
    handlers = ScalingHandlers(signals)
    return [
        Route(f"{SCALING_PATH}/lanes", handlers.lanes, methods=["GET"]),
        Route(f"{SCALING_PATH}/lanes/{{pool}}/{{machine_profile}}/{{bundle}}", handlers.lane, methods=["GET"]),
    ]
