"""The gateway's work publisher (admission, publishing) and work items (seed 000 §2, §16.2; contracts B §4.1)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from sie.catalog import load_catalog
from sie.gateway.errors import ProvisioningError, QueueFullError, QueueUnavailableError
from sie.gateway.publisher import AdmissionLimits, QueueConsumers, WorkPublisher
from sie.gateway.router import LaneHints, Router
from sie.gateway.workitems import Ticket, encode_work, extract_work, score_work
from sie.pools import DemandTracker
from sie.settings import LaneSettings, StreamSettings
from sie.transport.base import Lane, NoConsumerError, TransportUnavailable
from sie.transport.loopback import LoopbackTransport
from sie.wire.http import EncodeParams, EncodeRequest, ExtractParams, ExtractRequest, Item, ScoreRequest

LANE = Lane("default", "default", "default")
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class Consumers:
    """A lane directory that answers from a set (the worker registry in a distributed gateway)."""

    def __init__(self, *served: Lane) -> None:
        self.served = set(served)

    async def has_consumer(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> bool:
        return lane in self.served

    def eligible_workers(
        self, lane: Lane, bundle_config_hash: str = "", workers: frozenset[str] | None = None
    ) -> list[str]:
        return sorted(workers or ())


async def test_whether_a_lane_is_served_is_the_consumers_answer_not_the_queues() -> None:
    async with LoopbackTransport() as transport:
        await transport.consumer(LANE)  # a durable consumer exists, but no live worker serves the lane
        with pytest.raises(ProvisioningError, match="pool 'default'"):
            await WorkPublisher(transport, Consumers(), "gw").admit(LANE)
        await WorkPublisher(transport, Consumers(LANE), "gw").admit(LANE)


async def test_no_consumer_is_provisioning() -> None:
    async with LoopbackTransport() as transport:
        with pytest.raises(ProvisioningError, match="pool 'default'"):
            await WorkPublisher(transport, QueueConsumers(transport), "gw").admit(LANE)
        await transport.consumer(LANE)
        await WorkPublisher(transport, QueueConsumers(transport), "gw").admit(LANE)


async def test_pool_over_its_pending_limit_is_queue_full(catalog_route) -> None:
    async with LoopbackTransport() as transport:
        await transport.consumer(LANE)
        publisher = WorkPublisher(transport, QueueConsumers(transport), "gw", AdmissionLimits(max_stream_pending=1))
        items = encode_work(catalog_route, ticket(), EncodeRequest(items=[Item(text="a"), Item(text="b")]), ["dense"])
        await publisher.publish(catalog_route.lane, catalog_route.subject, items)
        with pytest.raises(QueueFullError, match="2 pending"):
            await publisher.admit(LANE)


async def test_full_stream_is_queue_full_and_closed_transport_is_unavailable(catalog_route) -> None:
    transport = LoopbackTransport(StreamSettings(max_msgs=1))
    async with transport:
        publisher = WorkPublisher(transport, QueueConsumers(transport), "gw")
        items = encode_work(catalog_route, ticket(), EncodeRequest(items=[Item(text="a"), Item(text="b")]), ["dense"])
        with pytest.raises(QueueFullError):
            await publisher.publish(catalog_route.lane, catalog_route.subject, items)
    with pytest.raises(QueueUnavailableError):
        await publisher.publish(catalog_route.lane, catalog_route.subject, items)
    with pytest.raises(QueueUnavailableError):
        await WorkPublisher(transport, QueueConsumers(transport), "gw").admit(LANE)


async def test_no_consumer_at_publish_is_provisioning(catalog_route) -> None:
    class NoConsumerQueue:
        async def submit_work_batch(self, subject: str, items: object) -> None:
            raise NoConsumerError(subject)

    publisher = WorkPublisher(NoConsumerQueue(), NoConsumerQueue(), "gw")  # type: ignore[arg-type]
    items = encode_work(catalog_route, ticket(), EncodeRequest(items=[Item(text="a")]), ["dense"])
    with pytest.raises(ProvisioningError):
        await publisher.publish(catalog_route.lane, catalog_route.subject, items)


async def test_provisioning_records_demand_on_every_candidate_lane_and_a_publish_serves_its_own(catalog_route) -> None:
    other = Lane("default", "l4", "default")
    demand = DemandTracker(60.0)
    async with LoopbackTransport() as transport:
        publisher = WorkPublisher(transport, Consumers(), "gw", demand=demand)
        with pytest.raises(ProvisioningError):
            await publisher.admit(LANE, demand_lanes=(LANE, other))
        with pytest.raises(ProvisioningError):
            await publisher.admit(LANE)
        key = ("default", "default", "default")
        assert demand.snapshot() == {key: 2, ("default", "l4", "default"): 1}
        await transport.consumer(LANE)
        items = encode_work(catalog_route, ticket(), EncodeRequest(items=[Item(text="a")]), ["dense"])
        await publisher.publish(catalog_route.lane, catalog_route.subject, items)
        assert demand.snapshot() == {("default", "l4", "default"): 1}  # only the lane served is cleared


async def test_lane_in_flight_limit_counts_and_sheds_only_when_enforced() -> None:
    demand = DemandTracker(60.0)
    async with LoopbackTransport() as transport:
        counted = WorkPublisher(transport, Consumers(LANE), "gw", limits=AdmissionLimits(max_lane_in_flight_items=3))
        enforced = WorkPublisher(
            transport,
            Consumers(LANE),
            "gw",
            demand=demand,
            limits=AdmissionLimits(max_lane_in_flight_items=3, enforce_lane_limit=True),
        )
        with enforced.in_flight(LANE, 2), counted.in_flight(LANE, 2):
            await counted.admit(LANE, items=2)  # over the limit, but only counted
            await enforced.admit(LANE, items=1)  # 2 + 1 fits
            with pytest.raises(QueueFullError, match="2 work items in flight"):
                await enforced.admit(LANE, items=2)
            assert demand.snapshot() == {("default", "default", "default"): 1}
        await enforced.admit(LANE, items=5)  # an empty lane takes any one request
        with enforced.in_flight(LANE, 1):
            pass
        with enforced.in_flight(LANE, 3), pytest.raises(QueueFullError):
            await enforced.admit(LANE, items=1)


def test_a_capped_pools_request_goes_to_one_of_its_workers_spread_by_request_id() -> None:
    publisher = WorkPublisher(None, Consumers(LANE), "gw")  # type: ignore[arg-type]
    workers = frozenset({"w-1", "w-2", "w-3"})
    chosen = {publisher.direct_worker(LANE, f"request-{n}", "", workers) for n in range(60)}
    assert chosen == {"w-1", "w-2", "w-3"}
    again = publisher.direct_worker(LANE, "request-7", "", workers)
    assert again == publisher.direct_worker(LANE, "request-7", "", frozenset({"w-3", "w-2", "w-1"}))
    assert publisher.direct_worker(LANE, "r", "", frozenset()) is None


async def test_a_direct_publish_the_worker_stream_refuses_goes_on_the_lane(catalog_route) -> None:
    class DirectRefused:
        def __init__(self) -> None:
            self.sent: list[str] = []

        async def submit_work_batch(self, subject: str, items: object) -> asyncio.Future[None]:
            self.sent.append(subject)
            stored = asyncio.get_running_loop().create_future()
            if subject.endswith(".w-1"):
                stored.set_exception(NoConsumerError(subject))  # the worker's stream is gone
            else:
                stored.set_result(None)
            return stored

    queue = DirectRefused()
    publisher = WorkPublisher(queue, Consumers(), "gw")  # type: ignore[arg-type]
    items = encode_work(catalog_route, ticket(), EncodeRequest(items=[Item(text="a")]), ["dense"])
    stored = await publisher.publish(catalog_route.lane, catalog_route.subject, items, f"{catalog_route.subject}.w-1")
    await stored
    assert queue.sent == [f"{catalog_route.subject}.w-1", catalog_route.subject]


def test_request_ids_and_reply_subjects() -> None:
    publisher = WorkPublisher(None, None, "gw-1")  # type: ignore[arg-type]
    first, second = publisher.new_request(), publisher.new_request()
    for request_id, reply in (first, second):
        parsed = uuid.UUID(request_id)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122) and str(parsed) == request_id
        assert reply == f"_INBOX.gw-1.{request_id}"
    assert first[0] != second[0]
    # A gateway restarted with the same router id never reuses an id (cancel tombstones outlive it).
    restarted = WorkPublisher(None, None, "gw-1")  # type: ignore[arg-type]
    assert restarted.new_request()[0] not in (first[0], second[0])


@pytest.fixture(scope="module")
def catalog_route(baseline_catalog_dir):
    catalog = load_catalog(baseline_catalog_dir / "bundles", baseline_catalog_dir / "models")
    return Router(lambda: catalog, LaneSettings()).route(MINILM, "int8", LaneHints())


def ticket() -> Ticket:
    return Ticket("gw-7", "_INBOX.gw.gw-7", "gw", 100.0, 130.0)


def test_encode_work_items_carry_params_and_ids(catalog_route) -> None:
    params = EncodeParams(
        output_types=["dense"], output_dtype="float16", instruction="q:", options={"profile": "int8", "is_query": True}
    )
    request = EncodeRequest(items=[Item(id="a", text="x"), Item(text="y")], params=params)
    first, second = encode_work(catalog_route, ticket(), request, ["dense"])
    assert (first.work_item_id, first.item_index, first.total_items) == ("gw-7.0", 0, 2)
    assert (second.work_item_id, second.item) == ("gw-7.1", {"text": "y"})
    assert first.item == {"id": "a", "text": "x"}
    assert (first.model_id, first.profile_id, first.operation) == (f"{MINILM}:int8", "int8", "encode")
    assert (first.pool_name, first.admission_pool, first.machine_profile) == ("default", "default", "default")
    assert (first.reply_subject, first.router_id, first.timestamp, first.deadline) == (
        "_INBOX.gw.gw-7",
        "gw",
        100.0,
        130.0,
    )
    assert (first.output_types, first.instruction, first.is_query) == (["dense"], "q:", True)
    assert first.options == {"profile": "int8", "is_query": True, "output_dtype": "float16"}


def test_score_is_one_work_item_with_query_and_candidates(catalog_route) -> None:
    request = ScoreRequest(query=Item(id="q", text="?"), items=[Item(text="a"), Item(id="b", text="b")],
                           instruction="i", options={"k": 1})  # fmt: skip
    (item,) = score_work(catalog_route, ticket(), request)
    assert (item.work_item_id, item.item_index, item.total_items, item.operation) == ("gw-7.0", 0, 1, "score")
    assert (item.item, item.query_item) == (None, {"id": "q", "text": "?"})
    assert item.score_items == [{"text": "a"}, {"id": "b", "text": "b"}]
    assert (item.instruction, item.options, item.is_query) == ("i", {"k": 1}, False)


def test_extract_work_items_carry_labels_and_schema(catalog_route) -> None:
    params = ExtractParams(labels=["person"], output_schema={"type": "object"}, instruction="find", options={"t": 0.3})
    (item,) = extract_work(catalog_route, ticket(), ExtractRequest(items=[Item(text="Tim")], params=params))
    assert (item.operation, item.labels, item.output_schema) == ("extract", ["person"], {"type": "object"})
    assert (item.instruction, item.options) == ("find", {"t": 0.3})


class RefusingQueue:
    """A work stream that refuses the first `refusals` publishes (its leader is being elected), then stores them."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.sent: list[list[object]] = []

    async def submit_work_batch(self, subject: str, items: list[object]) -> asyncio.Future[None]:
        self.sent.append(list(items))
        stored = asyncio.get_running_loop().create_future()
        if self.refusals:
            self.refusals -= 1
            stored.set_exception(TransportUnavailable("no JetStream leader"))
        else:
            stored.set_result(None)
        return stored


async def test_a_republish_the_stream_refuses_is_tried_again_while_its_request_waits(monkeypatch) -> None:
    """After a reconnect a request's unanswered work is published again; a refusal (the stream's leader still being
    elected) is retried, each time with the items still unanswered, until the stream stores them."""
    import sie.gateway.publisher as publisher_module
    from support.polling import eventually

    monkeypatch.setattr(publisher_module, "REPUBLISH_RETRY_S", 0.01)
    queue = RefusingQueue(refusals=2)
    publisher = WorkPublisher(queue, Consumers(), "gw")  # type: ignore[arg-type]
    unanswered = ["a", "b", "c"]
    publisher.republish(LANE, "work.subject", lambda: list(unanswered))
    await eventually(lambda: len(queue.sent) == 1)
    unanswered.remove("b")  # answered meanwhile (the first delivery's result came after all)
    await eventually(lambda: len(queue.sent) == 3)
    await asyncio.sleep(0.1)
    assert queue.sent == [["a", "b", "c"], ["a", "c"], ["a", "c"]]  # stored on the third try, then no more


async def test_a_republish_ends_once_nobody_waits_for_its_results(monkeypatch) -> None:
    import sie.gateway.publisher as publisher_module
    from support.polling import eventually

    monkeypatch.setattr(publisher_module, "REPUBLISH_RETRY_S", 0.01)
    monkeypatch.setattr(publisher_module, "REPUBLISH_RETRY_MAX_S", 0.02)
    queue = RefusingQueue(refusals=10**6)
    publisher = WorkPublisher(queue, Consumers(), "gw")  # type: ignore[arg-type]
    unanswered = ["a"]
    publisher.republish(LANE, "work.subject", lambda: list(unanswered))
    await eventually(lambda: len(queue.sent) >= 2)
    unanswered.clear()  # the request timed out (or failed): its slots name nothing now
    sent = len(queue.sent)
    await asyncio.sleep(0.2)  # ten retry intervals
    assert len(queue.sent) <= sent + 1  # at most the try already under way
