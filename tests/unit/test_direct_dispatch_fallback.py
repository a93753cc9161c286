"""Worker direct-dispatch fallback, piece by piece (seed 000 §8.2, issue 33): the batch_cancel subject, the
`direct_origin` result marker on the wire, the dispatcher's delayed (and immediate) fallback on the lane with its
batch_cancel announced only once the lane stored the work, and the sidecar's batch_cancel tombstones, which drop only
direct-dispatch encode/score/extract work. The end-to-end flow over a real nats-server is in
tests/integration/test_direct_dispatch_fallback.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

from sie.catalog import load_catalog
from sie.catalog.names import (
    batch_cancel_subject,
    batch_cancel_wildcard,
    is_work_worker_subject,
    work_subject,
    work_worker_subject,
)
from sie.gateway.collector import Collector
from sie.gateway.dispatch import Collected, Dispatcher
from sie.gateway.publisher import WorkPublisher
from sie.gateway.router import LaneHints, Route, Router
from sie.gateway.workitems import Ticket, encode_work, generate_work
from sie.settings import LaneSettings
from sie.sidecar.abandonment import Abandonment, Tombstones, batch_cancel_key
from sie.transport.base import Lane, NoConsumerError
from sie.transport.loopback import LoopbackTransport
from sie.wire import from_msgpack, to_msgpack, unstructure
from sie.wire.http import EncodeRequest, Item
from sie.wire.queue import GenerateParams, WorkItem, WorkResult
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ROUTER = "gw"
WORKER = "w-1"
DELAY_S = 0.05


# --- names and wire -------------------------------------------------------------------------------------------


def test_batch_cancel_subjects_name_the_router_the_worker_and_the_request() -> None:
    assert batch_cancel_subject("gw-1", "pod.1", "r-1") == "batch_cancel.gw-1.pod_dot_1.r-1"
    assert batch_cancel_wildcard("pod.1") == "batch_cancel.*.pod_dot_1.*"
    assert batch_cancel_key(batch_cancel_subject("gw-1", "w", "r-1")) == ("gw-1", "r-1")
    for other in ("batch_cancel.gw.w", "batch_cancel.gw..r", "work_cancel.gw.w.r", "batch_cancel.a.b.c.d"):
        assert batch_cancel_key(other) is None, other
    with pytest.raises(ValueError, match="empty"):
        batch_cancel_subject("gw", " ", "r")


def test_the_direct_origin_marker_is_left_off_the_wire_unless_set() -> None:
    plain = WorkResult(work_item_id="r.0", request_id="r", item_index=0, success=True)
    assert "direct_origin" not in unstructure(plain) and plain.direct_origin is None
    marked = attrs.evolve(plain, direct_origin=True)
    assert unstructure(marked)["direct_origin"] is True
    assert from_msgpack(to_msgpack(marked), WorkResult).direct_origin is True
    assert from_msgpack(to_msgpack(plain), WorkResult).direct_origin is None  # what an older sidecar sends


# --- the dispatcher ---------------------------------------------------------------------------------------------


class Queue(LoopbackTransport):
    """The loopback transport with worker streams that store (or refuse) direct work, every publish recorded and
    the lane's ACK held back until the test releases it (`lane_ack`)."""

    def __init__(self, direct_stores: bool = True) -> None:
        super().__init__()
        self.direct_stores = direct_stores
        self.sent: list[tuple[str, list[WorkItem]]] = []
        self.lane_ack: asyncio.Future[None] | None = None

    async def submit_work_batch(self, subject: str, items: Sequence[WorkItem]) -> asyncio.Future[None]:
        self.sent.append((subject, list(items)))
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if is_work_worker_subject(subject):
            if self.direct_stores:
                stored.set_result(None)
            else:
                stored.set_exception(NoConsumerError(subject))
            return stored
        await super().submit_work_batch(subject, items)
        if self.lane_ack is not None:
            return self.lane_ack
        stored.set_result(None)
        return stored

    def on(self, subject: str) -> list[int]:
        """The item indexes published on `subject`, in order."""
        return [item.item_index for sent, items in self.sent if sent == subject for item in items]


class Consumers:
    """Every lane is served; its eligible workers are the assigned ones given, else w-1 and w-2."""

    async def has_consumer(self, lane: Lane, bundle_config_hash: str = "", workers: Any = None) -> bool:
        return True

    def eligible_workers(self, lane: Lane, bundle_config_hash: str = "", workers: Any = None) -> list[str]:
        return sorted(workers) if workers is not None else ["w-1", "w-2"]


class Pools:
    """A capped pool `acme` assigned WORKER."""

    def assigned(self, name: str) -> frozenset[str]:
        return frozenset({WORKER})


class Gateway:
    def __init__(self, queue: Queue, dispatcher: Dispatcher, route: Route) -> None:
        self.queue = queue
        self.dispatcher = dispatcher
        self.route = route
        self.cancels: list[str] = []

    @property
    def lane(self) -> str:
        return self.route.subject

    @property
    def direct(self) -> str:
        lane = self.route.lane
        return work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, self.route.model_id, WORKER)

    def collect(self, count: int) -> asyncio.Future[Collected]:
        request = EncodeRequest(items=[Item(text=f"t{n}") for n in range(count)])
        return asyncio.ensure_future(
            self.dispatcher.collect(
                self.route, lambda ticket: encode_work(self.route, ticket, request, ["dense"]), None
            )
        )

    def request_id(self) -> str:
        return self.queue.sent[0][1][0].request_id

    async def answer(self, index: int, *, direct: bool, worker_id: str) -> None:
        request_id = self.request_id()
        result = WorkResult(work_item_id=f"{request_id}.{index}", request_id=request_id, item_index=index,
                            success=True, worker_id=worker_id, direct_origin=direct or None)  # fmt: skip
        await self.queue.publish_result(f"_INBOX.{ROUTER}.{request_id}", result)


@pytest.fixture
async def gateway(baseline_catalog_dir) -> AsyncIterator[Gateway]:
    catalog = load_catalog(baseline_catalog_dir / "bundles", baseline_catalog_dir / "models")
    route = Router(lambda: catalog, LaneSettings()).route(MINILM, None, LaneHints())
    route = attrs.evolve(route, admission_pool="acme")
    async with Queue() as queue, Collector(queue, ROUTER) as collector:
        publisher = WorkPublisher(queue, Consumers(), ROUTER)
        dispatcher = Dispatcher(
            Router(lambda: catalog, LaneSettings()), Pools(), publisher, collector, 10.0,  # type: ignore[arg-type]
            direct_fallback_delay_s=DELAY_S,
        )  # fmt: skip
        gw = Gateway(queue, dispatcher, route)
        subscription = await queue.subscribe("batch_cancel.>", lambda subject, _: gw.cancels.append(subject))
        yield gw
        await subscription.unsubscribe()


async def test_items_still_unanswered_after_the_delay_go_on_the_lane_once_and_the_cancel_waits_for_its_ack(
    gateway: Gateway,
) -> None:
    gateway.queue.lane_ack = asyncio.get_running_loop().create_future()
    request = gateway.collect(3)
    await eventually(lambda: gateway.queue.on(gateway.direct) == [0, 1, 2], what="the direct publish")
    await gateway.answer(0, direct=True, worker_id=WORKER)  # the worker answers one item in time

    await eventually(lambda: gateway.queue.on(gateway.lane) == [1, 2], what="the fallback of items 1 and 2")
    await asyncio.sleep(DELAY_S * 4)  # nothing more happens while the lane has not stored them
    assert gateway.cancels == [] and gateway.queue.on(gateway.lane) == [1, 2]
    await gateway.answer(1, direct=True, worker_id=WORKER)  # before the lane's ACK: still the worker's answer

    gateway.queue.lane_ack.set_result(None)
    cancel = f"batch_cancel.{ROUTER}.{WORKER}.{gateway.request_id()}"
    await eventually(lambda: gateway.cancels == [cancel], what="the batch_cancel")
    await gateway.answer(2, direct=True, worker_id=WORKER)  # late: item 2 fell back, so this is ignored
    await asyncio.sleep(0)
    assert not request.done()
    await gateway.answer(2, direct=False, worker_id="w-lane")
    collected = await request
    assert [result.worker_id for result in collected.results] == [WORKER, WORKER, "w-lane"]
    assert gateway.queue.on(gateway.lane) == [1, 2] and gateway.cancels == [cancel]  # once


async def test_a_request_answered_in_time_never_falls_back(gateway: Gateway) -> None:
    request = gateway.collect(2)
    await eventually(lambda: gateway.queue.on(gateway.direct) == [0, 1], what="the direct publish")
    await gateway.answer(0, direct=True, worker_id=WORKER)
    await gateway.answer(1, direct=True, worker_id=WORKER)
    await request
    await asyncio.sleep(DELAY_S * 3)
    assert gateway.queue.on(gateway.lane) == [] and gateway.cancels == []


async def test_a_refused_direct_publish_goes_on_the_lane_at_once_and_the_cancel_follows_its_ack(
    gateway: Gateway,
) -> None:
    gateway.queue.direct_stores = False
    gateway.queue.lane_ack = asyncio.get_running_loop().create_future()
    request = gateway.collect(2)
    await eventually(lambda: gateway.queue.on(gateway.lane) == [0, 1], what="the lane publish")
    assert gateway.queue.on(gateway.direct) == [0, 1]
    await asyncio.sleep(DELAY_S * 3)
    assert gateway.cancels == []
    gateway.queue.lane_ack.set_result(None)
    await eventually(lambda: len(gateway.cancels) == 1, what="the batch_cancel")
    await gateway.answer(0, direct=True, worker_id=WORKER)  # a copy the worker's stream kept after all: ignored
    await gateway.answer(0, direct=False, worker_id="w-lane")
    await gateway.answer(1, direct=False, worker_id="w-lane")
    collected = await request
    assert [result.worker_id for result in collected.results] == ["w-lane", "w-lane"]
    assert gateway.queue.on(gateway.lane) == [0, 1]  # no delayed fallback after an immediate one


async def test_a_generation_goes_to_one_eligible_worker_of_the_lane_or_on_the_lane_when_refused(
    gateway: Gateway,
) -> None:
    route = attrs.evolve(gateway.route, admission_pool=None)  # not a capped pool: any eligible worker of the lane
    lane = route.lane

    def subject_of(worker: str) -> str:
        return work_worker_subject(lane.pool, lane.machine_profile, lane.bundle, route.model_id, worker)

    def build(ticket: Ticket) -> WorkItem:
        return generate_work(route, ticket, GenerateParams(prompt="hi"))

    streamed = await gateway.dispatcher.stream(route, build, None)
    streamed.close()
    (subject, _), *rest = gateway.queue.sent
    assert rest == [] and subject in {subject_of("w-1"), subject_of("w-2")}

    gateway.queue.direct_stores = False
    streamed = await gateway.dispatcher.stream(route, build, None)
    streamed.close()
    assert [subject for subject, _ in gateway.queue.sent[1:]] == [gateway.queue.sent[1][0], route.subject]
    assert is_work_worker_subject(gateway.queue.sent[1][0])
    await asyncio.sleep(DELAY_S * 3)  # a generation never falls back later, nor announces a batch_cancel
    assert len(gateway.queue.sent) == 3 and gateway.cancels == []


# --- the sidecar's batch_cancel tombstones ---------------------------------------------------------------------


def work(request_id: str, subject: str, operation: str = "encode", router_id: str = ROUTER) -> SimpleNamespace:
    item = SimpleNamespace(router_id=router_id, request_id=request_id, deadline=None)
    return SimpleNamespace(item=item, operation=operation, delivery=SimpleNamespace(subject=subject))


async def test_a_batch_cancel_drops_only_the_requests_direct_encode_score_extract_work() -> None:
    lane_subject = work_subject("p", "l4", "default", MINILM)
    direct_subject = work_worker_subject("p", "l4", "default", MINILM, WORKER)
    abandonment = Abandonment(Tombstones(horizon_s=60.0))
    await abandonment.on_batch_cancel(batch_cancel_subject(ROUTER, WORKER, "r-1"), {})
    await abandonment.on_batch_cancel("batch_cancel.malformed", {})
    works = [
        work("r-1", direct_subject),  # dropped
        work("r-1", direct_subject, "score"),  # dropped
        work("r-1", lane_subject),  # the lane's copy, which now answers the request
        work("r-1", direct_subject, "generate"),  # a generation has its own cancel
        work("r-2", direct_subject),  # another request
        work("r-1", direct_subject, router_id="gw-other"),  # another gateway's request
    ]
    live, dropped = abandonment.split(works)
    assert dropped == works[:2] and live == works[2:]
    assert abandonment.dropped == {"fallen_back": 2}
