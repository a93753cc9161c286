"""The sidecar's `/healthz` and `/readyz` over a real socket: plain answers, readiness transitions driven by
a HealthPublisher pinging the real WorkerService, and a server that closes on exit."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sie.settings import BatchingSettings, LaneSettings
from sie.sidecar.pod.health import HealthPublisher, WorkerIdentity
from sie.sidecar.pod.probes import ProbeServer
from sie.transport.loopback import LoopbackTransport
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService
from support.polling import eventually

HOST = "127.0.0.1"
IDENTITY = WorkerIdentity("worker-probes", "default", "cpu", "default")
INTERVAL_S = 0.05
WAIT_S = 10.0


class Flag:
    def __init__(self) -> None:
        self.value = False

    def __call__(self) -> bool:
        return self.value


class FlakyWorker:
    """The WorkerService whose Ping can be made to fail, as a dead IPC connection would."""

    def __init__(self, service: WorkerService) -> None:
        self.service = service
        self.broken = False

    async def ping(self, request):
        if self.broken:
            raise ConnectionResetError("worker socket closed")
        return await self.service.ping(request)


@pytest.fixture()
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
        yield client


@pytest.fixture()
async def worker(baseline_catalog, load_model):
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        yield FlakyWorker(WorkerService(manager, BatchRunner(manager), IDENTITY.worker_id, LaneSettings(),
                                        BatchingSettings()))  # fmt: skip


async def test_probe_answers(client: httpx.AsyncClient) -> None:
    ready = Flag()
    async with ProbeServer(ready, 0, HOST) as probes:
        base = f"http://{HOST}:{probes.port}"
        live = await client.get(f"{base}/healthz")
        assert (live.status_code, live.text) == (200, "ok")
        assert live.headers["content-type"] == "text/plain; charset=utf-8"
        not_ready = await client.get(f"{base}/readyz")
        assert (not_ready.status_code, not_ready.text) == (503, "not ready")
        ready.value = True
        assert (await client.get(f"{base}/readyz?verbose=1")).status_code == 200
        head = await client.head(f"{base}/readyz")
        assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == "2"
        assert (await client.get(f"{base}/metrics")).status_code == 404
        assert (await client.post(f"{base}/readyz")).status_code == 405


async def test_garbage_gets_400_and_a_failing_check_means_not_ready(client: httpx.AsyncClient) -> None:
    def broken() -> bool:
        raise RuntimeError("bug in the readiness check")

    async with ProbeServer(broken, 0, HOST) as probes:
        reader, writer = await asyncio.open_connection(HOST, probes.port)
        writer.write(b"hello\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 400 Bad Request\r\n")
        writer.close()
        await writer.wait_closed()
        assert (await client.get(f"http://{HOST}:{probes.port}/readyz")).status_code == 503
        assert (await client.get(f"http://{HOST}:{probes.port}/healthz")).status_code == 200


async def test_server_closes_on_exit_even_with_an_idle_client() -> None:
    async with ProbeServer(Flag(), 0, HOST) as probes:
        port = probes.port
        _, idle = await asyncio.open_connection(HOST, port)  # connects and never sends a request
    with pytest.raises(OSError):
        await asyncio.open_connection(HOST, port)
    idle.close()
    with pytest.raises(RuntimeError):
        _ = probes.port


async def test_readyz_follows_the_health_publisher(client: httpx.AsyncClient, worker: FlakyWorker) -> None:
    async with (
        LoopbackTransport() as transport,
        HealthPublisher(transport, worker, IDENTITY, INTERVAL_S) as health,
        ProbeServer(lambda: health.ready, 0, HOST) as probes,
    ):
        readyz = f"http://{HOST}:{probes.port}/readyz"

        async def status_is(code: int) -> bool:
            return (await client.get(readyz)).status_code == code

        await eventually(lambda: status_is(200), timeout_s=WAIT_S)
        worker.broken = True  # IPC Ping fails: not ready at the next beat
        await eventually(lambda: status_is(503), timeout_s=WAIT_S)
        worker.broken = False
        await eventually(lambda: status_is(200), timeout_s=WAIT_S)
        health.begin_drain()
        assert await status_is(503)
        assert (await client.get(f"http://{HOST}:{probes.port}/healthz")).status_code == 200  # still alive
