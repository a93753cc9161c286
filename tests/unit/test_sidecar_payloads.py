"""Offloaded payloads fetched back by the sidecar (sie.sidecar.payloads, seed 001 "Preparation And Framing"), with a
real local payload store and the real settler: payloads are inlined, failures answered with a classified error
and ACKed (never NAKed into a redelivery loop), and work cancelled around the fetch is dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.sidecar.abandonment import Abandonment, Tombstones
from sie.sidecar.admission import Admission
from sie.sidecar.payloads import PayloadResolver
from sie.sidecar.settlement import Settler
from sie.sidecar.work import Work
from sie.stores.payload_store import PayloadStore
from sie.telemetry.metrics import Telemetry
from sie.telemetry.sidecar import SidecarMetrics
from sie.wire import codes
from sie.wire.offload import offloaded, packed_payload, payload_key
from sie.wire.queue import WorkItem, WorkResult
from support.prometheus import counts_by
from support.sidecar_fakes import RecordingDelivery


class Bus:
    def __init__(self, log: list) -> None:
        self.log = log
        self.results: list[WorkResult] = []

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        self.results.append(result)
        self.log.append(("publish", result.work_item_id))

    async def flush(self) -> None:
        self.log.append(("flush",))


def item(index: int, operation: str = "encode", **fields: object) -> WorkItem:
    base = dict(
        work_item_id=f"gw-2.{index}", request_id="gw-2", item_index=index, total_items=4, operation=operation,
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject="_INBOX.gw.gw-2", timestamp=0.0,
    )  # fmt: skip
    return WorkItem(**(base | fields))


class Stage:
    """A resolver over a local store, settling through a real Settler into a recording bus."""

    def __init__(self, store: PayloadStore | None, max_bytes: int = 1 << 20) -> None:
        self.telemetry = Telemetry()
        self.log: list = []
        self.bus = Bus(self.log)
        self.admission = Admission(100)
        self.tombstones = Tombstones(60.0)
        settler = Settler(self.bus, self.admission, Abandonment(self.tombstones))
        metrics = SidecarMetrics(self.telemetry)
        self.resolver = PayloadResolver(store, settler.live, settler.reply, "w-9", max_bytes, metrics)

    def fetches(self) -> dict[str, float]:
        """`sie_worker_payload_fetches_total` by outcome, as a scrape shows it."""
        return counts_by(self.telemetry, "sie_worker_payload_fetches_total", "outcome")

    def works(self, *items: WorkItem) -> list[Work]:
        works = [Work(RecordingDelivery(entry, self.log, "sie.work.default.default.default.m"), 0.0) for entry in items]
        self.admission.admit("m", works)
        return works


@pytest.fixture()
def store(tmp_path: Path) -> PayloadStore:
    return PayloadStore(str(tmp_path / "payloads"))


async def offload(store: PayloadStore, original: WorkItem) -> WorkItem:
    await store.put(payload_key(original), packed_payload(original))
    return offloaded(original, payload_key(original))


async def test_offloaded_payloads_are_put_back_and_inline_items_are_untouched(store: PayloadStore) -> None:
    stage = Stage(store)
    encode = item(0, item={"text": "long " * 100})
    score = item(1, "score", query_item={"text": "q"}, score_items=[{"text": "a"}, {"id": "b", "text": "b"}])
    inline = item(2, item={"text": "short"})
    works = stage.works(await offload(store, encode), await offload(store, score), inline)
    resolved = await stage.resolver.resolve(works)
    assert [work.item for work in resolved] == [encode, score, inline]
    assert stage.log == [] and stage.resolver.fetched == 2 and stage.fetches() == {"fetched": 2.0}
    assert await store.exists(payload_key(encode))  # the gateway deletes its keys, not the sidecar


@pytest.mark.parametrize(
    ("prepare", "code"),
    [("missing", codes.INTERNAL_ERROR), ("too_large", codes.PAYLOAD_TOO_LARGE), ("garbage", codes.INTERNAL_ERROR)],
)
async def test_a_failed_fetch_answers_its_item_and_acks_it(store: PayloadStore, prepare: str, code: str) -> None:
    stage = Stage(store, max_bytes=1000)
    good = item(0, item={"text": "fine"})
    bad = item(1, item={"text": "x" * 2000 if prepare == "too_large" else "y"})
    if prepare == "garbage":
        await store.put(payload_key(bad), b"\xc1 not msgpack")
    elif prepare == "too_large":
        await store.put(payload_key(bad), packed_payload(bad))
    works = stage.works(await offload(store, good), offloaded(bad, payload_key(bad)))
    resolved = await stage.resolver.resolve(works)
    assert [work.item for work in resolved] == [good]
    (answer,) = stage.bus.results
    assert answer.work_item_id == "gw-2.1" and not answer.success and answer.error_code == code
    assert stage.log == [("publish", "gw-2.1"), ("flush",), ("ack", "gw-2.1")]  # answered once, never NAKed
    assert stage.admission.total == 1
    outcome = {"missing": "missing", "too_large": "over_limit", "garbage": "malformed"}[prepare]
    assert stage.fetches() == {"fetched": 1.0, outcome: 1.0}


async def test_a_worker_without_a_store_answers_offloaded_items_with_an_error_naming_the_setting() -> None:
    stage = Stage(None)
    works = stage.works(offloaded(item(0, item={"text": "t"}), "gw-2_0.bin"))
    assert await stage.resolver.resolve(works) == []
    assert "SIE_PAYLOAD_STORE_URL" in stage.bus.results[0].error
    assert stage.fetches() == {"no_store": 1.0}


async def test_work_cancelled_while_its_payload_was_read_is_dropped_unanswered(store: PayloadStore) -> None:
    stage = Stage(store)
    works = stage.works(await offload(store, item(0, item={"text": "t"})))
    stage.tombstones.add("gw", "gw-2")  # the cancel arrives; the preparer asked before the fetch
    assert await stage.resolver.resolve(works) == []
    assert stage.bus.results == [] and stage.log == [("ack", "gw-2.0")]
