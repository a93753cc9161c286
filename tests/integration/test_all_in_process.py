"""`--role all` in one process, wired as roles/all.py wires it (the real WorkerService over the baseline
MiniLM, the loopback transport, the sidecar, the gateway app) and driven over HTTP: result bodies travel
as values, so nothing packs or unpacks one between the worker and the HTTP edge (DESIGN.md §7)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.publisher import QueueConsumers
from sie.settings import BatchingSettings, GatewaySettings, LaneSettings, StreamSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire import payload, unpackb
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.gateway_fakes import NoWorkers

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]


@pytest.fixture()
def no_result_packing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any pack or unpack of a result body fails the test."""

    def forbidden(*_: object) -> None:
        raise AssertionError("a result body was packed or unpacked inside one process")

    monkeypatch.setattr(payload, "packb", forbidden)
    monkeypatch.setattr(payload, "unpackb", forbidden)


@pytest.fixture()
async def client(baseline_catalog, load_model) -> AsyncIterator[httpx.AsyncClient]:
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        service = WorkerService(manager, BatchRunner(manager), "w-1", LaneSettings(), BatchingSettings())
        lane = Lane("default", "default", "default")
        async with (
            LoopbackTransport(StreamSettings()) as transport,
            Sidecar(transport, service, lane, SidecarConfig()),
        ):
            sources = GatewaySources(lambda: manager.catalog, transport, QueueConsumers(transport), NoWorkers())
            app = build_gateway_app(sources, GatewaySettings(), LaneSettings(), "gw")
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
            ):
                yield http


async def test_encode_and_score_travel_without_a_msgpack_round_trip(
    client: httpx.AsyncClient, no_result_packing: None
) -> None:
    encoded = await client.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "Hello world"}]}, timeout=60)
    assert encoded.status_code == 200, encoded.text
    assert np.allclose(encoded.json()["items"][0]["dense"]["values"][:4], HELLO_WORLD_PREFIX, atol=1e-5)

    as_msgpack = await client.post(
        f"/v1/encode/{MINILM}", json={"items": [{"text": "Hello world"}]}, headers={"accept": "application/msgpack"}
    )
    values = unpackb(as_msgpack.content)["items"][0]["dense"]["values"]  # the HTTP edge's encoding, not a result's
    assert np.allclose(values[:4], HELLO_WORLD_PREFIX, atol=1e-5)

    scored = await client.post(
        f"/v1/score/{MINILM}",
        json={"query": {"text": "capital of France"}, "items": [{"text": "Berlin"}, {"text": "Paris is in France"}]},
    )
    assert scored.status_code == 200, scored.text
    assert scored.json()["scores"][0]["item_id"] == "item-1"
