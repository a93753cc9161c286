"""Placement on real worker children (`--devices cpu:2`), driven over HTTP through the stack `--role all` wires
(gateway app → loopback transport → sidecar → fleet → children) with the placement surface mounted beside it:
round_robin uses both children, lpt_packing keeps a model on its replicas and a repack adds one, a draining
child's batches fail over, and worker processes on `{socket}.{i}` are found, lost and found again."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import REPO, RoleProcess
from sie.gateway.http.app import GatewaySources, build_gateway_app
from sie.gateway.publisher import QueueConsumers
from sie.http.handlers import plain_handler_routes
from sie.placement.api import PATH_PREFIXES, PlacementApi
from sie.placement.metrics import PlacementCollector
from sie.roles.local_workers import open_local_workers
from sie.roles.serving import baseline_catalog, metrics_routes
from sie.settings import LaneSettings, Settings, load_role_settings
from sie.sidecar import Sidecar, WorkerHooks
from sie.sidecar.pod.children import ChildDirectory, LocalChildren, SocketChildren
from sie.sidecar.pod.fleet import WorkerFleet
from sie.telemetry.metrics import Telemetry
from sie.transport.loopback import LoopbackTransport
from support.gateway_fakes import NoWorkers
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]


def settings_for(mode: str, extra: Mapping[str, str] | None = None) -> Settings:
    env = {"SIE_MODEL_CACHE": os.environ.get("SIE_MODEL_CACHE", str(REPO / ".cache" / "models"))}
    env |= {"SIE_PLACEMENT_MODE": mode, "SIE_PLACEMENT_PROBE_INTERVAL_S": "0.2", **(extra or {})}
    return load_role_settings(["--role", "all", "--devices", "cpu:2"], env)


@asynccontextmanager
async def served(settings: Settings, directory: ChildDirectory) -> AsyncIterator[tuple[httpx.AsyncClient, WorkerFleet]]:
    """The gateway app over the fleet of `directory`'s children, with the placement routes."""
    async with AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(WorkerFleet.from_settings(directory, settings.placement))
        transport = await stack.enter_async_context(LoopbackTransport(settings.stream))
        await stack.enter_async_context(
            Sidecar.from_settings(transport, fleet, settings, WorkerHooks(replicas=fleet.replicas))
        )
        catalog = baseline_catalog(settings)
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers())
        telemetry = Telemetry()  # `/metrics` as the all role serves it: placement's series and the children's
        telemetry.register(PlacementCollector(fleet.snapshot))
        routes = [
            *plain_handler_routes(PlacementApi(fleet).handle, PATH_PREFIXES),
            *metrics_routes(telemetry, fleet.metric_sources),
        ]
        app = build_gateway_app(sources, settings.gateway, LaneSettings(), "gw", extra_routes=routes)
        await stack.enter_async_context(app.router.lifespan_context(app))
        http = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60)
        )
        yield http, fleet


@asynccontextmanager
async def in_process(mode: str, extra: Mapping[str, str] | None = None):
    settings = settings_for(mode, extra)
    async with AsyncExitStack() as stack:
        workers = await open_local_workers(stack, settings, baseline_catalog(settings))
        children = LocalChildren({worker.name: worker.service for worker in workers})
        async with served(settings, children) as (http, fleet):
            yield http, fleet, workers


async def encode_many(http: httpx.AsyncClient, count: int) -> None:
    async def one(index: int) -> None:
        response = await http.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "Hello world"}] * (1 + index % 3)})
        assert response.status_code == 200, response.text
        assert np.allclose(response.json()["items"][0]["dense"]["values"][:4], HELLO_WORLD_PREFIX, atol=1e-5)

    await asyncio.gather(*(one(index) for index in range(count)))


def routed(state: dict, model: str = MINILM) -> dict[str, int]:
    """child → batches routed to it, from GET /v1/placement."""
    for entry in state["models"]:
        if entry["model"] == model:
            return {replica["worker"]: replica["routed_batches"] for replica in entry["replicas"]}
    return {}


def loaded_on(state: dict, model: str = MINILM) -> list[str]:
    return [child["name"] for child in state["children"] if model in child["loaded_models"]]


async def test_round_robin_runs_a_model_on_both_cpu_children() -> None:
    async with in_process("round_robin") as (http, fleet, workers):
        assert [(worker.name, worker.device) for worker in workers] == [("worker-0", "cpu"), ("worker-1", "cpu")]
        await encode_many(http, 1)  # ready once one child loaded it; the other finishes loading meanwhile
        await eventually(lambda: fleet.replicas(MINILM) == 2, timeout_s=60.0)
        await encode_many(http, 12)
        await fleet.probe()  # the placement table shows what the last probe round saw
        state = (await http.get("/v1/placement")).json()
        assert [child["name"] for child in state["children"]] == ["worker-0", "worker-1"]
        assert loaded_on(state) == ["worker-0", "worker-1"]
        counts = routed(state)
        assert counts["worker-0"] > 0 and counts["worker-1"] > 0, counts
        metrics = (await http.get("/metrics")).text
        assert f'sie_placement_model_replicas{{model="{MINILM}"}} 2.0' in metrics
        assert 'sie_worker_batch_items_count{device="cpu",model="' in metrics


async def test_lpt_packing_keeps_a_model_on_one_child_until_an_operator_adds_a_replica() -> None:
    async with in_process("lpt_packing") as (http, fleet, workers):
        await encode_many(http, 8)
        await fleet.probe()
        state = (await http.get("/v1/placement")).json()
        (host,) = loaded_on(state)
        assert set(routed(state)) == {host}
        changed = await http.post(f"/v1/placement/models/{MINILM}", json={"replicas": 2})
        assert changed.status_code == 200, changed.text
        repacked = await http.post("/v1/placement/repack", params={"wait": "60"})
        assert repacked.status_code == 200, repacked.text
        await fleet.probe()
        state = (await http.get("/v1/placement")).json()
        assert loaded_on(state) == ["worker-0", "worker-1"]  # the wait returned once the new replica loaded
        await encode_many(http, 12)
        state = (await http.get("/v1/placement")).json()
        assert len(routed(state)) == 2 and all(count > 0 for count in routed(state).values()), routed(state)


async def test_a_draining_child_gives_its_batches_to_the_other_one() -> None:
    async with in_process("round_robin") as (http, fleet, workers):
        await encode_many(http, 1)
        await eventually(lambda: fleet.replicas(MINILM) == 2, timeout_s=60.0)
        workers[0].service.draining = True  # it answers every batch with a NAK from now on

        def executed(index: int) -> int:
            usage = workers[index].service.runner.usage.get(MINILM)
            return usage.batches if usage is not None else 0

        before = (executed(0), executed(1))
        await encode_many(http, 8)  # each answer is checked: every request was served
        assert executed(0) == before[0]  # the draining child ran nothing; what it gave back failed over
        assert executed(1) > before[1]


@pytest.fixture()
def socket_path() -> Iterator[Path]:
    directory = tempfile.mkdtemp(prefix="sie-fleet-", dir="/tmp")
    yield Path(directory) / "worker.sock"
    shutil.rmtree(directory, ignore_errors=True)


def child_pid(parent: int, socket: Path) -> int | None:
    """The pid of `parent`'s child serving `socket` (its SIE_IPC_SOCKET_PATH), from /proc."""
    wanted = f"SIE_IPC_SOCKET_PATH={socket}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        if int(fields[1]) == parent and fields[0] != "Z" and wanted in environ:
            return int(entry)
    return None


@pytest.mark.slow
async def test_worker_processes_are_found_lost_and_found_again(socket_path: Path, tmp_path: Path) -> None:
    env = {"SIE_IPC_SOCKET_PATH": str(socket_path), "SIE_WORKER_ID": "w"}
    worker = RoleProcess("worker", ["--devices", "cpu:2", "--preload", MINILM], env, tmp_path / "worker.log")
    try:
        children = [Path(f"{socket_path}.0"), Path(f"{socket_path}.1")]
        await eventually(lambda: all(path.exists() for path in children), timeout_s=120.0)
        settings = settings_for("round_robin")
        async with served(settings, SocketChildren(socket_path)) as (http, fleet):
            await eventually(lambda: fleet.ready and fleet.size == 2, timeout_s=120.0)
            await encode_many(http, 6)
            assert fleet.replicas(MINILM) == 2
            victim = child_pid(worker.process.pid, children[0])
            assert victim is not None, worker.log()
            os.kill(victim, signal.SIGKILL)
            await encode_many(http, 6)  # lost: nothing fails, worker-1 serves (failover, then the probe)
            await eventually(lambda: fleet.replicas(MINILM) == 1, timeout_s=30.0)
            # Found again: the supervisor restarts it on the same socket, the fleet warms the model there.
            await eventually(lambda: fleet.replicas(MINILM) == 2, timeout_s=120.0)
            await encode_many(http, 6)
    finally:
        code = worker.stop()
    assert code == 0, worker.log()
