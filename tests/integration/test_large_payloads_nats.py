"""Large payloads over a real nats-server whose max_payload is 64 KiB (issue 13 §3; seed 000 §16.2, seed 001): the
gateway app and a sidecar serving the real MiniLM, each on its own NATS connection.

- result_chunk_v1: a multivector encode whose every result is several broker messages large is answered whole; a
  work item whose gateway does not accept chunks is answered PAYLOAD_TOO_LARGE once and ACKed, instead of failing
  to publish until its deliveries run out.
- payload offload: items too large for a broker message go through the payload store (a local directory, S3 on a
  real SeaweedFS, GCS on a real fake-gcs-server, Azure Blob on a real Azurite), and their keys are gone once the
  request is answered; without a store such a request is refused with 413. So does a chat generation's prompt
  (the real SmolLM2 answers it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import fsspec
import httpx
import numpy as np
import pytest

from launcher import NatsServer
from sie.catalog.names import work_subject
from sie.gateway.http.app import GatewaySources, build_gateway_app, collector_of
from sie.gateway.offload import PayloadOffload
from sie.gateway.publisher import QueueConsumers
from sie.settings import BatchingSettings, GatewaySettings, LaneSettings, StreamSettings
from sie.settings.messaging import NatsSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.stores.payload_store import PayloadNotFoundError, PayloadOverLimitError, PayloadStore, open_payload_store
from sie.transport.base import Lane
from sie.transport.nats import NatsTransport
from sie.wire import codes
from sie.wire.queue import WorkItem, WorkResult
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.gateway_fakes import NoWorkers
from support.object_stores import BUCKET, AzuriteBlob, object_store
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAX_PAYLOAD = 64 * 1024
LANE = Lane("large", "default", "default")
ROUTER = "gw-large"
# ~300 words: the model's full sequence, so one multivector result is about 254 x 384 float32, 381 KiB.
LONG_TEXT = " ".join(f"word{index % 97} stands beside token{index % 89}" for index in range(300))


@pytest.fixture(scope="module")
def small_nats(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats-small"), max_payload=MAX_PAYLOAD)
    try:
        yield server
    finally:
        server.stop()


class StoreBase:
    """One fresh prefix of a store, and raw fsspec access to list what is left there."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url, self.storage_options = url, storage_options or {}
        self.store = PayloadStore(url, self.storage_options)

    def keys(self) -> list[str]:
        filesystem, root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **self.storage_options)
        filesystem.invalidate_cache()
        # SeaweedFS keeps an emptied prefix as a directory entry: only what lies below the root counts.
        return [name.rsplit("/", 1)[-1] for name in filesystem.find(root) if name.rstrip("/") != root.rstrip("/")]


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def store_base(request: pytest.FixtureRequest, tmp_path: Path) -> StoreBase:
    if request.param == "local":
        return StoreBase(str(tmp_path / "payloads"))
    server = object_store(request.param, request)
    return StoreBase(server.url(f"payloads-{uuid.uuid4().hex}"), server.storage_options)


class Deployment:
    """A gateway app and a sidecar with the real worker, on two NATS connections to one broker; both use `store`."""

    def __init__(self, url: str, service: WorkerService, catalog: Any, store: PayloadStore | None) -> None:
        self.url, self.service, self.catalog, self.store = url, service, catalog, store

    async def __aenter__(self) -> Deployment:
        self._stack = stack = AsyncExitStack()
        settings = NatsSettings(url=self.url)
        self.sidecar_transport = await stack.enter_async_context(NatsTransport(settings, StreamSettings()))
        config = SidecarConfig(worker_id="w-large", payload_store=self.store)
        await stack.enter_async_context(Sidecar(self.sidecar_transport, self.service, LANE, config))
        self.transport = transport = await stack.enter_async_context(NatsTransport(settings, StreamSettings()))
        self.offload = PayloadOffload(self.store, lambda: transport.max_payload)
        stack.push_async_callback(self.offload.aclose)
        sources = GatewaySources(
            lambda: self.catalog, transport, QueueConsumers(transport), NoWorkers(), offload=self.offload
        )
        lane = LaneSettings(pool=LANE.pool, machine_profile=LANE.machine_profile, bundle=LANE.bundle)
        self.app = build_gateway_app(sources, GatewaySettings(request_timeout_s=60.0), lane, ROUTER)
        await stack.enter_async_context(self.app.router.lifespan_context(self.app))
        asgi = httpx.ASGITransport(app=self.app)
        self.client = await stack.enter_async_context(
            httpx.AsyncClient(transport=asgi, base_url="http://gw", timeout=60.0)
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()


@pytest.fixture()
async def service(baseline_catalog, load_model) -> AsyncIterator[WorkerService]:
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        yield WorkerService(manager, BatchRunner(manager), "w-large", LaneSettings(), BatchingSettings())


@pytest.fixture()
async def deployment(small_nats: NatsServer, service: WorkerService) -> AsyncIterator[Deployment]:
    async with Deployment(small_nats.url, service, service.manager.catalog, None) as running:
        yield running


# --- result_chunk_v1 --------------------------------------------------------------------------------------


async def test_a_multivector_encode_far_over_the_broker_limit_is_answered_whole(deployment: Deployment) -> None:
    assert deployment.transport.max_payload == MAX_PAYLOAD
    body = {
        "items": [{"id": f"doc-{index}", "text": f"{index} {LONG_TEXT}"} for index in range(4)],
        "params": {"output_types": ["multivector"], "options": {"profile": "multivector"}},
    }
    response = await deployment.client.post(f"/v1/encode/{MINILM}", json=body)
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [item["id"] for item in items] == [f"doc-{index}" for index in range(4)]
    for item in items:
        vectors = np.asarray(item["multivector"]["values"], dtype=np.float32)
        assert vectors.shape[0] > 200 and vectors.shape[1] == 384
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        # Not vacuous: no broker message could carry this result whole, so it came as result chunks.
        assert vectors.nbytes > 5 * MAX_PAYLOAD
    # Nothing of the transfers stays reserved once the request ended.
    collector = collector_of(deployment.app)
    assert collector.chunk_budget.reserved_bytes == 0 and len(collector) == 0


async def test_without_accepts_result_chunks_a_large_result_is_payload_too_large_once(
    deployment: Deployment,
) -> None:
    received: list[WorkResult] = []
    await deployment.transport.subscribe_results("_INBOX.old-gw.>", received.append)
    variant = f"{MINILM}:multivector"
    item = WorkItem(
        work_item_id="old-1.0", request_id="old-1", item_index=0, total_items=1, operation="encode", model_id=variant,
        profile_id="multivector", pool_name=LANE.pool, machine_profile=LANE.machine_profile, router_id="old-gw",
        reply_subject="_INBOX.old-gw.old-1", timestamp=time.time(), item={"text": LONG_TEXT},
        output_types=["multivector"], accepts_result_chunks=False,
    )  # fmt: skip
    subject = work_subject(LANE.pool, LANE.machine_profile, LANE.bundle, variant)
    await deployment.transport.publish_work(subject, item)
    await eventually(lambda: received, timeout_s=60.0, what="the answer to the old gateway's item")
    (answer,) = received
    assert not answer.success and answer.error_code == codes.PAYLOAD_TOO_LARGE
    assert str(MAX_PAYLOAD) in answer.error
    # ACKed after the answer: the stream holds nothing that could be redelivered.
    await eventually(lambda: _drained(deployment), timeout_s=10.0, what="the work stream to drain")
    assert len(received) == 1


async def _drained(deployment: Deployment) -> bool:
    return await deployment.transport.pending(LANE.pool) == 0


# --- payload offload --------------------------------------------------------------------------------------

# Each item is over 64 KiB of msgpack, so it can only have reached the worker through the payload store.
BIG_ITEMS = [{"id": f"big-{index}", "text": f"{index} " + "lorem ipsum dolor sit amet " * 3000} for index in range(2)]
CANDIDATES = [{"id": f"doc-{index}", "text": f"document {index} " + "filler words " * 600} for index in range(12)]


async def test_items_over_the_broker_limit_go_through_the_payload_store_and_their_keys_are_deleted(
    small_nats: NatsServer, service: WorkerService, store_base: StoreBase
) -> None:
    async with Deployment(small_nats.url, service, service.manager.catalog, store_base.store) as running:
        encoded = await running.client.post(f"/v1/encode/{MINILM}", json={"items": BIG_ITEMS + [{"text": "small"}]})
        assert encoded.status_code == 200, encoded.text
        assert [item.get("id") for item in encoded.json()["items"]] == ["big-0", "big-1", None]
        assert all(len(item["dense"]["values"]) == 384 for item in encoded.json()["items"])
        query = {"text": "document 7"}
        scored = await running.client.post(f"/v1/score/{MINILM}", json={"query": query, "items": CANDIDATES})
        assert scored.status_code == 200, scored.text
        assert {entry["item_id"] for entry in scored.json()["scores"]} == {item["id"] for item in CANDIDATES}
        await running.offload.aclose()  # the deletes are detached: wait for the ones in flight
        assert store_base.keys() == []


async def test_without_a_store_an_item_over_the_broker_limit_is_refused_with_413(deployment: Deployment) -> None:
    response = await deployment.client.post(f"/v1/encode/{MINILM}", json={"items": BIG_ITEMS})
    assert response.status_code == 413, response.text
    assert response.json()["detail"]["code"] == "PAYLOAD_TOO_LARGE"
    assert "SIE_PAYLOAD_STORE_URL" in response.json()["detail"]["message"]
    assert await deployment.transport.pending(LANE.pool) == 0  # nothing was queued


# 60 KB of '=' is about 940 of SmolLM2's tokens (it has a token for 64 of them): over the broker's limit, quick to read.
LONG_PROMPT = "Count the signs: " + "=" * 60_000


async def test_a_chat_prompt_over_the_broker_limit_goes_through_the_payload_store(
    small_nats: NatsServer, service: WorkerService, tmp_path: Path
) -> None:
    store = StoreBase(str(tmp_path / "payloads"))
    chat = {"model": SMOLLM, "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 2}
    async with Deployment(small_nats.url, service, service.manager.catalog, store.store) as running:
        answered = await running.client.post("/v1/chat/completions", json=chat)
        assert answered.status_code == 200, answered.text
        body = answered.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 900 < body["usage"]["prompt_tokens"] < 2000 and body["usage"]["completion_tokens"] <= 2
        await running.offload.aclose()
        assert store.keys() == []  # deleted once the stream ended
    async with Deployment(small_nats.url, service, service.manager.catalog, None) as without_store:
        refused = await without_store.client.post("/v1/chat/completions", json=chat)
        assert refused.status_code == 413, refused.text
        assert "The prompt is" in refused.text and "SIE_PAYLOAD_STORE_URL" in refused.text
        assert await without_store.transport.pending(LANE.pool) == 0


async def test_the_store_round_trips_with_a_bounded_read_on_every_backend(store_base: StoreBase) -> None:
    store = store_base.store
    await store.put("gw-1-1_0.bin", b"p" * 5000)
    assert await store.get("gw-1-1_0.bin", max_bytes=5000) == b"p" * 5000
    with pytest.raises(PayloadOverLimitError):
        await store.get("gw-1-1_0.bin", max_bytes=4999)
    await store.delete("gw-1-1_0.bin")
    await store.delete("gw-1-1_0.bin")
    with pytest.raises(PayloadNotFoundError):
        await store.get("gw-1-1_0.bin", max_bytes=5000)
    assert store_base.keys() == []


async def test_the_sweep_reads_each_backends_write_times(store_base: StoreBase) -> None:
    """The sweep reads when each object was written from its backend's own field (local mtime, S3 LastModified,
    GCS updated, Azure last_modified): keys written now are kept by an hour's age and swept once an hour has passed."""
    import time

    store = store_base.store
    for key in ("gw-2-1_0.bin", "gw-2-1_1.bin"):
        await store.put(key, b"left behind")
    assert await store.sweep(older_than_s=3600) == 0
    assert sorted(store_base.keys()) == ["gw-2-1_0.bin", "gw-2-1_1.bin"]
    assert await store.sweep(older_than_s=3600, now=time.time() + 7200) == 2
    assert store_base.keys() == []


async def test_an_abfs_store_opened_without_options_reads_the_azure_sdks_environment(
    azurite: AzuriteBlob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gateways and sidecars pass no storage_options: adlfs finds the account in AZURE_STORAGE_CONNECTION_STRING."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    store = open_payload_store(f"az://{BUCKET}/payloads-{uuid.uuid4().hex}")
    assert store is not None
    await store.put("gw-3-1_0.bin", b"by the environment")
    assert await store.get("gw-3-1_0.bin", max_bytes=100) == b"by the environment"
    await store.delete("gw-3-1_0.bin")
    assert not await store.exists("gw-3-1_0.bin")
