"""The sidecar's pool admission gate, its decisions alone (seed 000 §16.3, seed 001 "Pool Admission"): own-pool and
pool-less work is admitted as without the gate; an uncapped logical pool on this lane's queue admits every worker, a
capped one only its assigned workers; unknown pools, pools of another queue and, before the gateway ever answered,
every logical pool are refused. `GET /v1/pools` documents (the shape `sie.pools` writes) are read leniently; the
polling and the NAKs through a real broker are in tests/integration/test_sidecar_pool_admission.py."""

from __future__ import annotations

import pytest

from sie.pools import AssignedWorker, Pool, PoolSpec
from sie.settings import ignored_variables, load_role_settings
from sie.sidecar import SidecarConfig
from sie.sidecar.admission import Admission
from sie.sidecar.consumer import Consumer, ConsumerOptions
from sie.sidecar.hashgate import WorkerHash
from sie.sidecar.pinning import PinnedModels
from sie.sidecar.pool_admission import (
    GatewayPools,
    PoolGate,
    PoolStatusError,
    PoolView,
    Refusal,
    parse_pools,
    pinned_models,
    refusal,
)
from sie.sidecar.settlement import Settler
from sie.sidecar.work import Work
from sie.wire.ipc_control import EnsureModelReadyRequest, EnsureModelReadyResponse, PingRequest, PingResponse
from sie.wire.queue import WorkItem
from support.pools_gateway import pool_json
from support.sidecar_fakes import RecordingDelivery

LANE = "default"
ME, OTHER = "w-me", "w-other"
VIEW = parse_pools(
    {
        "pools": [
            pool_json("default", protected=True),
            pool_json("gold", queue_pool="gold", protected=True),
            pool_json("open", gpus={"l4": 1}),
            pool_json("acme", gpus={"l4": 2}, gpu_caps={"l4": 2}, assigned=[ME]),
            pool_json("full", gpus={"l4": 1}, gpu_caps={"l4": 1}, assigned=[OTHER]),
            pool_json("on-gold", queue_pool="gold", gpus={"l4": 1}),
        ]
    }
)


@pytest.mark.parametrize(
    ("admission_pool", "expected"),
    [
        (None, None),  # published before admission pools existed
        ("", None),
        ("default", None),  # the lane's own queue pool
        ("DEFAULT", None),  # names are canonicalized to lower case
        ("open", None),  # uncapped logical pool backed by this queue: every worker
        ("acme", None),  # capped, and this worker is assigned
        ("full", Refusal.NOT_ASSIGNED),  # capped, assigned to another worker only
        ("on-gold", Refusal.OTHER_QUEUE),  # backed by another queue pool than this lane's
        ("gold", Refusal.OTHER_QUEUE),
        ("gone", Refusal.UNKNOWN_POOL),  # expired, deleted or never created: fail closed
    ],
)
def test_refusal_under_a_view(admission_pool: str | None, expected: Refusal | None) -> None:
    assert refusal(admission_pool, LANE, ME, VIEW) is expected


def test_the_capped_pool_admits_the_assigned_worker_only() -> None:
    assert refusal("full", LANE, OTHER, VIEW) is None
    assert refusal("acme", LANE, OTHER, VIEW) is Refusal.NOT_ASSIGNED


def test_a_static_queue_lane_admits_its_own_and_its_logical_pools() -> None:
    assert refusal("gold", "gold", ME, VIEW) is None
    assert refusal("on-gold", "gold", ME, VIEW) is None
    assert refusal("open", "gold", ME, VIEW) is Refusal.OTHER_QUEUE


def test_without_a_view_only_the_lanes_own_pool_is_admitted() -> None:
    assert refusal(None, LANE, ME, None) is None
    assert refusal("default", LANE, ME, None) is None
    assert refusal("open", LANE, ME, None) is Refusal.NO_VIEW
    assert refusal("acme", LANE, ME, None) is Refusal.NO_VIEW


def test_parse_reads_only_what_the_gate_needs() -> None:
    assert VIEW["acme"] == PoolView("acme", "default", capped=True, assigned=frozenset({ME}))
    assert VIEW["open"] == PoolView("open", "default", capped=False, assigned=frozenset())
    assert VIEW["on-gold"].queue_pool == "gold"
    lenient = {"pools": [{"spec": {"name": "Mixed", "extra": 1}, "status": {}, "future": True}], "more": []}
    assert parse_pools(lenient) == {"mixed": PoolView("mixed", "default", capped=False, assigned=frozenset())}


def test_a_worker_keeps_the_models_pinned_by_the_pools_whose_work_it_serves() -> None:
    def pinning(name: str, models: list[str], **fields: object) -> dict:
        document = pool_json(name, **fields)
        document["spec"]["pinned_models"] = models
        return document

    view = parse_pools({"pools": [
        pinning("open", ["m/open"], gpus={"l4": 1}),  # uncapped on this lane's queue: every worker
        pinning("mine", ["m/mine", "m/shared"], gpus={"l4": 1}, gpu_caps={"l4": 1}, assigned=[ME]),
        pinning("theirs", ["m/theirs", "m/shared"], gpus={"l4": 1}, gpu_caps={"l4": 1}, assigned=[OTHER]),
        pinning("gold", ["m/gold"], queue_pool="gold", gpus={"l4": 1}),  # another queue: other workers
        pinning("odd", [3, "", "m/odd"], gpus={"l4": 1}),  # only names count
    ]})  # fmt: skip
    assert view["mine"].pinned == ("m/mine", "m/shared")
    assert pinned_models(view, LANE, ME) == {"m/open", "m/mine", "m/shared", "m/odd"}
    assert pinned_models(view, LANE, OTHER) == {"m/open", "m/theirs", "m/shared", "m/odd"}
    assert pinned_models(view, "gold", ME) == {"m/gold"}


class PinRecorder:
    """A worker that records the EnsureModelReady requests it gets; `refuse` models raise."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.requests: list[tuple[str, bool | None]] = []
        self.refuse = refuse

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        self.requests.append((request.model_id, request.pin))
        if request.model_id in self.refuse:
            raise RuntimeError("no worker child is ready")
        return EnsureModelReadyResponse(state="loading_started")


async def test_pinned_models_are_pinned_on_every_poll_and_released_once_no_pool_pins_them() -> None:
    worker = PinRecorder(refuse=frozenset({"m/broken"}))
    pinned = PinnedModels(worker)
    await pinned.keep(frozenset({"m/a", "m/b", "m/broken"}))  # a refusal is logged, the others still pinned
    await pinned.keep(frozenset({"m/b"}))
    assert worker.requests == [
        ("m/a", True), ("m/b", True), ("m/broken", True),  # first poll
        ("m/b", True), ("m/a", False), ("m/broken", False),  # again (a restarted child), then the released
    ]  # fmt: skip
    assert pinned.pinned == {"m/b"}


def test_parse_leaves_out_unusable_entries_so_their_work_is_refused() -> None:
    document = {"pools": [pool_json("ok"), {"spec": {"queue_pool": "default"}}, "junk", {"spec": {"name": 3}}]}
    assert set(parse_pools(document)) == {"ok"}


@pytest.mark.parametrize("document", [[], {"items": []}, {"pools": {}}, "pools", None])
def test_parse_refuses_another_document_shape(document: object) -> None:
    with pytest.raises(PoolStatusError):
        parse_pools(document)


def _item(index: int, admission_pool: str | None) -> WorkItem:
    return WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation="encode",
        model_id="m", profile_id="default", pool_name=LANE, machine_profile="default", router_id="gw",
        reply_subject=f"_INBOX.gw.r{index}", timestamp=0.0, admission_pool=admission_pool,
    )  # fmt: skip


def _gate(view: dict[str, PoolView] | None) -> PoolGate:
    gate = PoolGate(GatewayPools("http://127.0.0.1:9"), LANE, ME)
    gate.pools = view
    return gate


def test_split_counts_refusals_by_pool_and_reason() -> None:
    log: list = []
    works = [Work(RecordingDelivery(_item(i, pool), log), 0.0) for i, pool in enumerate(["acme", "full", None, "x"])]
    admitted, refused = _gate(VIEW).split(works)
    assert [w.item.admission_pool for w in admitted] == ["acme", None]
    assert [w.item.admission_pool for w in refused] == ["full", "x"]
    gate = _gate(None)
    gate.split(works)
    assert gate.refused == {("acme", Refusal.NO_VIEW): 1, ("full", Refusal.NO_VIEW): 1, ("x", Refusal.NO_VIEW): 1}


class _Bus:
    async def publish_result(self, subject: str, result: object) -> None:
        raise AssertionError("nothing is answered here")

    async def flush(self) -> None:
        """Nothing to flush."""


class _Worker:
    async def ping(self, request: PingRequest) -> PingResponse:
        return PingResponse(timestamp_ms=request.timestamp_ms, worker_id=ME)


class _Out(list):
    async def put(self, group: tuple[str, list[Work]]) -> None:
        self.append(group)


async def test_the_consumer_naks_refused_work_with_the_nak_delay_before_admission() -> None:
    log: list = []
    admission = Admission(8)
    out = _Out()
    options = ConsumerOptions(fetch_budget=8, nak_delay_s=2.5, worker_id=ME, pools=_gate(VIEW))
    consumer = Consumer(None, admission, Settler(_Bus(), admission), WorkerHash(_Worker()), out, options)  # type: ignore[arg-type]
    await consumer.accept([RecordingDelivery(_item(i, pool), log) for i, pool in enumerate(["full", "acme", "gone"])])
    assert log == [("nak", "r0.0", 2.5), ("nak", "r2.0", 2.5)]
    assert [[w.item.work_item_id for w in works] for _, works in out] == [["r1.0"]]
    assert admission.total == 1  # the refused ones never took an admission slot


def test_the_sidecar_role_builds_the_gate_from_its_settings() -> None:
    environ = {
        "SIE_GATEWAY_URL": "http://gateway.sie:8080/",
        "SIE_GATEWAY_TOKEN": "t0ken",
        "SIE_POOL_POLL_INTERVAL_S": "2.5",
        "SIE_POOL": "Gold",
        "SIE_WORKER_ID": "pod-7",
    }
    gate = SidecarConfig.from_settings(load_role_settings(["--role", "sidecar"], environ)).pool_gate
    assert gate is not None
    assert (gate.source, gate.lane_pool, gate.worker_id) == (
        GatewayPools("http://gateway.sie:8080", "t0ken", 2.5),
        "gold",
        "pod-7",
    )
    assert SidecarConfig.from_settings(load_role_settings(["--role", "sidecar"], {})).pool_gate is None
    # `all` has no gate (its gateway is in the process): the variable is another role's, ignored and named.
    shared = {"SIE_GATEWAY_URL": "http://gateway.sie:8080"}
    assert SidecarConfig.from_settings(load_role_settings(["--role", "all"], shared)).pool_gate is None
    assert ignored_variables("all", shared) == ["SIE_GATEWAY_URL (read by role sidecar)"]


def test_the_gate_reads_the_shape_sie_pools_writes() -> None:
    """The gateway renders pools with `Pool.to_json`; the gate reads that document, not only the stand-in's."""
    worker = AssignedWorker(name=ME, machine_profile="l4", bundle="default", gpus=1)
    spec = PoolSpec(name="acme", queue_pool="gold", gpus={"l4": 2}, gpu_caps={"l4": 1}, ttl_seconds=60.0)
    pool = Pool(spec=spec, created_at=0.0, last_renewed=0.0, expires_at=60.0, assigned_workers=(worker,))
    view = parse_pools({"pools": [pool.to_json(0.0)]})
    assert view == {"acme": PoolView("acme", "gold", capped=True, assigned=frozenset({ME}))}
    assert refusal("acme", "gold", ME, view) is None
    assert refusal("acme", "gold", OTHER, view) is Refusal.NOT_ASSIGNED
