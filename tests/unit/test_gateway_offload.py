"""Payload offload decisions on the gateway (sie.gateway.offload, seed 000 §16.2, contracts Part B §4.1), with a
real local payload store: which items go through the store, under which keys, and that the keys are deleted
once the request ends; without a store, what does not fit the broker is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sie.gateway.errors import PayloadTooLargeError
from sie.gateway.offload import WORK_ITEM_HEADROOM_BYTES, PayloadOffload, size_bound
from sie.stores.payload_store import PayloadStore
from sie.telemetry.gateway import StoreMetrics
from sie.telemetry.metrics import Telemetry
from sie.wire import packb, to_msgpack, unpackb
from sie.wire.offload import payload_ref, restored
from sie.wire.queue import GenerateParams, WorkItem
from support.prometheus import counts_by

BROKER_LIMIT = 64 * 1024


def work(index: int, operation: str = "encode", **fields: object) -> WorkItem:
    base = dict(
        work_item_id=f"gw-3.{index}", request_id="gw-3", item_index=index, total_items=3, operation=operation,
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject="_INBOX.gw.gw-3", timestamp=0.0,
    )  # fmt: skip
    return WorkItem(**(base | fields))


class Hooks:
    """Collects the close hooks a request registers, and runs them as the collector would."""

    def __init__(self) -> None:
        self.hooks: list[Callable[[], None]] = []

    def __call__(self, hook: Callable[[], None]) -> None:
        self.hooks.append(hook)

    def close(self) -> None:
        for hook in self.hooks:
            hook()


@pytest.fixture()
def store(tmp_path: Path) -> PayloadStore:
    return PayloadStore(str(tmp_path / "payloads"))


def offloads(telemetry: Telemetry) -> dict[str, float]:
    """`sie_gateway_payload_offloads_total` by outcome, as a scrape shows it."""
    return counts_by(telemetry, "sie_gateway_payload_offloads_total", "outcome")


async def test_items_over_the_inline_limit_go_through_the_store_and_are_deleted_when_the_request_ends(
    store: PayloadStore,
) -> None:
    telemetry = Telemetry()
    offload = PayloadOffload(store, lambda: BROKER_LIMIT, inline_limit_bytes=10_000, metrics=StoreMetrics(telemetry))
    small = work(0, item={"text": "short"})
    large = work(1, item={"text": "é" * 8000})  # 16,000 bytes of UTF-8
    hooks = Hooks()
    published = await offload.prepare([small, large], hooks)
    assert published[0] == small
    assert published[1].item is None and published[1].payload_ref == "gw-3_1.bin" == payload_ref(published[1])
    stored = await store.get("gw-3_1.bin", max_bytes=1 << 20)
    assert restored(published[1], stored) == large
    assert not await store.exists("gw-3_0.bin")
    assert offloads(telemetry) == {"stored": 1.0}
    hooks.close()  # the request ended: the delete runs detached, and the role's shutdown awaits it
    await offload.aclose()
    assert not await store.exists("gw-3_1.bin")
    assert offloads(telemetry) == {"stored": 1.0, "deleted": 1.0}


async def test_a_score_request_stores_its_query_and_candidates_together(store: PayloadStore) -> None:
    offload = PayloadOffload(store, lambda: BROKER_LIMIT, inline_limit_bytes=1000)
    item = work(0, "score", total_items=1, query_item={"text": "q"}, score_items=[{"text": "d" * 600}] * 3)
    hooks = Hooks()
    (published,) = await offload.prepare([item], hooks)
    assert published.query_payload_ref == "gw-3_score.bin"
    assert published.query_item is None and published.score_items is None
    data = unpackb(await store.get("gw-3_score.bin", max_bytes=1 << 20))
    assert data == {"query": {"text": "q"}, "items": [{"text": "d" * 600}] * 3}
    hooks.close()
    await offload.aclose()
    assert not await store.exists("gw-3_score.bin")


async def test_a_generations_prompt_is_its_payload(store: PayloadStore) -> None:
    """The chat messages go through the store, the generation's settings stay in the item; read back, the item is
    what the gateway built. Without a store the refusal names the prompt."""
    params = GenerateParams(messages=[{"role": "user", "content": "w" * BROKER_LIMIT}], max_new_tokens=8, top_k=4)
    item = work(0, "generate", total_items=1, generate=params)
    hooks = Hooks()
    (published,) = await PayloadOffload(store, lambda: BROKER_LIMIT).prepare([item], hooks)
    assert published.payload_ref == "gw-3_0.bin"
    assert published.generate == GenerateParams(max_new_tokens=8, top_k=4) and published.item is None
    assert len(to_msgpack(published)) < 1024  # what the broker carries
    assert restored(published, await store.get("gw-3_0.bin", max_bytes=1 << 20)) == item
    with pytest.raises(PayloadTooLargeError, match="The prompt is"):
        await PayloadOffload(None, lambda: BROKER_LIMIT).prepare([item], Hooks())
    small = work(0, "generate", total_items=1, generate=GenerateParams(prompt="short"))
    assert await PayloadOffload(store, lambda: BROKER_LIMIT).prepare([small], Hooks()) == [small]


async def test_the_broker_limit_lowers_the_inline_limit(store: PayloadStore) -> None:
    offload = PayloadOffload(store, lambda: BROKER_LIMIT, inline_limit_bytes=1 << 20)
    assert offload.limit() == BROKER_LIMIT - WORK_ITEM_HEADROOM_BYTES
    (published,) = await offload.prepare([work(0, item={"text": "x" * BROKER_LIMIT})], Hooks())
    assert published.payload_ref == "gw-3_0.bin"


async def test_without_a_store_what_fits_the_broker_goes_inline_and_the_rest_is_refused() -> None:
    telemetry = Telemetry()
    offload = PayloadOffload(None, lambda: BROKER_LIMIT, inline_limit_bytes=1000, metrics=StoreMetrics(telemetry))
    fits = work(0, item={"text": "y" * 30_000})  # over the inline limit, under the broker's
    assert await offload.prepare([fits], Hooks()) == [fits]
    with pytest.raises(PayloadTooLargeError, match="SIE_PAYLOAD_STORE_URL") as caught:
        await offload.prepare([fits, work(1, item={"text": "z" * BROKER_LIMIT})], Hooks())
    assert caught.value.code == "PAYLOAD_TOO_LARGE" and "Item 1" in caught.value.message
    assert offloads(telemetry) == {"refused": 1.0}


async def test_a_transport_without_a_limit_never_offloads(store: PayloadStore) -> None:
    offload = PayloadOffload(store, lambda: None, inline_limit_bytes=10)
    huge = work(0, item={"text": "w" * 100_000})
    assert await offload.prepare([huge], Hooks()) == [huge]


@pytest.mark.parametrize(
    "value",
    [{"text": "ascii"}, {"text": "日本語テキスト" * 50}, {"images": [b"\x00" * 300]}, [1, 2.5, None, True, {"a": [1]}]],
)
def test_the_size_bound_never_underestimates(value: object) -> None:
    assert size_bound(value) >= len(packb(value))


async def test_the_periodic_sweep_deletes_what_a_crashed_gateway_left(store: PayloadStore, tmp_path: Path) -> None:
    """Keys no request end will delete (their gateway is gone) are swept once older than the age, every tenth of
    it, and counted as swept."""
    import asyncio
    import os
    import time

    telemetry = Telemetry()
    offload = PayloadOffload(store, lambda: BROKER_LIMIT, metrics=StoreMetrics(telemetry))
    await store.put("gw-dead_0.bin", b"left behind")
    await store.put("gw-live_0.bin", b"in flight")
    old = time.time() - 60
    os.utime(tmp_path / "payloads" / "gw-dead_0.bin", (old, old))
    async with offload.sweeping(older_than_s=10.0):
        for _ in range(100):  # the first sweep runs after a tenth of the age
            if not await store.exists("gw-dead_0.bin"):
                break
            await asyncio.sleep(0.05)
    assert not await store.exists("gw-dead_0.bin") and await store.exists("gw-live_0.bin")
    assert offloads(telemetry) == {"swept": 1.0}
