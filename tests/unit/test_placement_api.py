"""The placement control surface through `PlacementApi.handle` with a fake control: every route, every error
status and envelope, model ids with slashes, and the `wait` parameter."""

from __future__ import annotations

import orjson
import pytest

from sie.placement.api import MAX_BODY_BYTES, MAX_WAIT_S, ApiResponse, PlacementApi
from sie.placement.policy import LEAST_OUTSTANDING, ModelOverride, PlacementPolicy
from support.placement_fakes import BGE, MINI, FakeControl


@pytest.fixture
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture
def api(control: FakeControl) -> PlacementApi:
    return PlacementApi(control)


async def call(api: PlacementApi, method: str, path: str, body: object = b"", **query: str) -> ApiResponse:
    payload = body if isinstance(body, bytes) else orjson.dumps(body)
    response = await api.handle(method, path, query, payload)
    assert response is not None
    return response


def json_of(response: ApiResponse) -> object:
    assert response.content_type == "application/json"
    return orjson.loads(response.body)


def assert_error(response: ApiResponse, status: int, code: str, *words: str) -> None:
    assert response.status == status
    document = json_of(response)
    assert set(document) == {"error"} and set(document["error"]) == {"code", "message"}
    assert document["error"]["code"] == code
    for word in words:
        assert word in document["error"]["message"]


async def test_status_document(api: PlacementApi) -> None:
    response = await call(api, "GET", "/v1/placement")
    assert response.status == 200
    document = json_of(response)
    assert list(document) == ["mode", "work_basis", "routing_policy", "fill_mode", "policy", "children", "models",
                              "repacks", "compaction"]  # fmt: skip
    assert document["compaction"] == {"pending": False, "compactions_total": 0, "unloads_total": 0,
                                      "freed_bytes_total": 0}  # fmt: skip
    assert (document["mode"], document["work_basis"]) == ("lpt_packing", "items")
    assert (document["routing_policy"], document["fill_mode"]) == ("fill_least", "run")
    assert document["policy"]["hysteresis"] == 0.0 and document["policy"]["models"] == {}
    assert document["children"][0] == {
        "name": "worker-0",
        "device": "cuda:0",
        "ready": True,
        "loaded_models": [BGE, MINI],
        "inflight": {"batches": 2, "items": 48, "work": 0.75},
        "memory_budget_bytes": 80_000_000_000,
        "compute_seconds_total": 120.5,
    }
    assert document["children"][2]["memory_budget_bytes"] is None
    assert document["models"][0] == {
        "model": BGE,
        "replicas_setting": 2,
        "replicas": [
            {"worker": "worker-0", "device": "cuda:0", "weight": 0.5, "outstanding_items": 32, "routed_batches": 10,
             "routed_items": 300},
            {"worker": "worker-1", "device": "cuda:1", "weight": 0.5, "outstanding_items": 16, "routed_batches": 8,
             "routed_items": 250},
        ],
        "fill_mode": "run",
        "fill_factor": 1.0,
        "fill_quantum": 32,
        "demand": 0.6,
    }  # fmt: skip
    assert document["models"][1]["replicas_setting"] == "all"
    repacks = document["repacks"]
    assert (repacks["total"], repacks["by_trigger"]) == (3, {"startup": 1, "compute": 2})
    assert repacks["last"] == {
        "at": 1_700_000_000.0,
        "trigger": "manual",
        "models_placed": 2,
        "moved": [BGE],
        "held_by_hysteresis": [MINI],
        "compute_seconds": 12.5,
        "wall_seconds": 3.0,
    }


async def test_policy_lists_every_knob_with_model_overrides(control: FakeControl, api: PlacementApi) -> None:
    control.set_model(BGE, replicas=2, fill_mode="spread")
    policy = json_of(await call(api, "GET", "/v1/placement"))["policy"]
    assert policy == {
        "mode": "lpt_packing",
        "work_basis": "items",
        "rebalance_compute_seconds": 300.0,
        "first_rebalance_compute_seconds": 60.0,
        "ema_halflife_compute_seconds": 0.0,
        "hysteresis": 0.0,
        "default_replicas": 1,
        "routing_fill_factor": 1.0,
        "routing_policy": "fill_least",
        "routing_fill_mode": "run",
        "forbid_memory_oversubscription": True,
        "compaction_mode": "eager",
        "compaction_interval": 1,
        "models": {BGE: {"replicas": 2, "fill_mode": "spread"}},  # the overrides that are set
    }


@pytest.mark.parametrize("path", ["/", "/healthz", "/v1/placements", "/v1/encode/BAAI/bge-m3", "/metrics"])
async def test_other_paths_are_not_placement_paths(api: PlacementApi, path: str) -> None:
    assert await api.handle("GET", path, {}, b"") is None


async def test_set_model_with_a_slashed_id(control: FakeControl, api: PlacementApi) -> None:
    body = {"replicas": 2, "fill_mode": "spread", "fill_factor": 0.5}
    response = await call(api, "POST", f"/v1/placement/models/{BGE}", body)
    assert response.status == 200
    assert json_of(response) == {
        "model": BGE,
        "override": {"replicas": 2, "fill_mode": "spread", "fill_factor": 0.5},
        "effective": "next repack",
    }
    assert control.policy.models[BGE] == ModelOverride(2, "spread", 0.5)


async def test_set_model_takes_any_subset(control: FakeControl, api: PlacementApi) -> None:
    assert (await call(api, "POST", f"/v1/placement/models/{MINI}", {"replicas": "all"})).status == 200
    assert (await call(api, "POST", "/v1/placement/models/org/a/b", {"fill_factor": 2})).status == 200
    assert control.policy.models[MINI] == ModelOverride("all", None, None)
    assert control.policy.models["org/a/b"] == ModelOverride(None, None, 2.0)
    assert isinstance(control.policy.models["org/a/b"].fill_factor, float)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", ("not JSON",)),
        (b"", ("not JSON",)),
        ([1, 2], ("JSON object", "list")),
        ({"replicas": 2, "speed": 3}, ("unknown field", "speed")),
        ({"replicas": True}, ("replicas", "True")),
        ({"replicas": 1.5}, ("replicas", "1.5")),
        ({"fill_mode": 3}, ("fill_mode", "3")),
        ({"fill_factor": "half"}, ("fill_factor", "half")),
        ({"fill_factor": False}, ("fill_factor", "False")),
        ({"replicas": 0}, ("replicas", "0")),  # refused by the policy (PolicyError)
        ({"replicas": "some"}, ("'some'",)),
        ({"fill_mode": "sideways"}, ("sideways",)),
    ],
)
async def test_set_model_refuses_bad_bodies(api: PlacementApi, control: FakeControl, body: object, words) -> None:
    assert_error(await call(api, "POST", f"/v1/placement/models/{BGE}", body), 400, "bad_request", *words)
    assert control.policy.models == {}


async def test_set_policy(control: FakeControl, api: PlacementApi) -> None:
    response = await call(api, "POST", "/v1/placement/policy", {"hysteresis": 0.15, "routing_policy": "fill_rr"})
    assert response.status == 200
    document = json_of(response)
    assert (document["hysteresis"], document["routing_policy"], document["mode"]) == (0.15, "fill_rr", "lpt_packing")
    assert control.policy.hysteresis == 0.15


@pytest.mark.parametrize(
    ("body", "words"),
    [({"mode": "round_robin"}, ("mode",)), ({"speed": 1}, ("speed",)), (b"[]", ("JSON object",)), (b"x", ("JSON",))],
)
async def test_set_policy_refuses(api: PlacementApi, control: FakeControl, body: object, words) -> None:
    assert_error(await call(api, "POST", "/v1/placement/policy", body), 400, "bad_request", *words)
    assert control.policy == FakeControl().policy


@pytest.mark.parametrize(("wait", "expected"), [(None, 0.0), ("", 0.0), ("0", 0.0), ("2.5", 2.5), ("1e9", MAX_WAIT_S)])
async def test_repack_waits_as_asked(control: FakeControl, api: PlacementApi, wait, expected) -> None:
    query = {} if wait is None else {"wait": wait}
    response = await call(api, "POST", "/v1/placement/repack", **query)
    assert response.status == 200
    assert json_of(response)["trigger"] == "manual"
    assert control.waits == [expected]


@pytest.mark.parametrize("wait", ["-1", "soon", "nan", "inf", "-inf"])
async def test_repack_refuses_a_bad_wait(control: FakeControl, api: PlacementApi, wait: str) -> None:
    assert_error(await call(api, "POST", "/v1/placement/repack", wait=wait), 400, "bad_request", "wait", wait)
    assert control.waits == []


async def test_repack_outside_lpt_packing_is_a_conflict() -> None:
    api = PlacementApi(FakeControl(PlacementPolicy(mode=LEAST_OUTSTANDING)))
    response = await call(api, "POST", "/v1/placement/repack")
    assert_error(response, 409, "mode_conflict", "lpt_packing", "least_outstanding")


@pytest.mark.parametrize(
    "path", ["/v1/placement/", "/v1/placement/models/", "/v1/placement/models", "/v1/placement/nope"]
)
async def test_unknown_placement_paths_are_404(api: PlacementApi, path: str) -> None:
    assert_error(await call(api, "GET", path), 404, "not_found", path)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/placement"),
        ("PUT", "/v1/placement"),
        ("GET", "/v1/placement/policy"),
        ("GET", "/v1/placement/repack"),
        ("GET", f"/v1/placement/models/{BGE}"),
        ("DELETE", f"/v1/placement/models/{BGE}"),
    ],
)
async def test_wrong_methods_are_405(api: PlacementApi, method: str, path: str) -> None:
    assert_error(await call(api, method, path), 405, "method_not_allowed", method)


async def test_a_body_over_the_limit_is_413(api: PlacementApi, control: FakeControl) -> None:
    body = orjson.dumps({"hysteresis": 0.1, "pad": "x" * MAX_BODY_BYTES})
    assert_error(await call(api, "POST", "/v1/placement/policy", body), 413, "payload_too_large", str(MAX_BODY_BYTES))
    assert control.policy.hysteresis == 0.0
