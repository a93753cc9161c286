"""Gateway and sidecar started while NATS is down (issue 13 §3): the processes stay up, `/healthz` answers, the
gateway's `/readyz` answers 200 (process readiness only, seed 000 §4, so a load balancer keeps it) while its `/health`
says why requests cannot be routed, the sidecar's `/readyz` says not ready, inference answers 503 QUEUE_UNAVAILABLE
with Retry-After in each surface's envelope; once a
nats-server comes up on the configured port they connect by themselves, and the subscriptions they made at start
(heartbeats, config deltas, results, cancels) and the sidecar's lane consumer take effect."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import NatsServer, RoleProcess, free_port
from sie.catalog.names import CONFIG_ALL_SUBJECT, health_subject
from sie.settings.messaging import NatsSettings
from sie.transport.nats import NatsTransport
from sie.wire.config import ConfigNotification
from sie.wire.health import WorkerHeartbeat
from support.polling import holds_within

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]
DENSE = "sie.adapters.dense:OnnxDenseAdapter"
LATE_MODEL = "acme/late"
# The roles retry with a backoff capped at 10 s; a connect attempt to a closed port takes about a second more.
CONNECT_DEADLINE_S = 60.0
UNREACHABLE_LINE = "is unreachable; serving without it and retrying in the background"


class Gateway:
    """A `sie run --role gateway` subprocess pointed at `nats_url`."""

    def __init__(self, root: Path, nats_url: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        args = ["--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1], "--gateway-request-timeout", "60"]
        self.process = RoleProcess("gateway", args, {"SIE_NATS_URL": nats_url}, root / "gateway.log")

    def status(self, path: str) -> int:
        return httpx.get(f"{self.url}{path}", timeout=10).status_code


def nats_down(root: Path) -> tuple[int, str]:
    """A free loopback port where no nats-server listens yet, and its URL."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return port, f"nats://127.0.0.1:{port}"


def assert_queue_unavailable(gateway: Gateway) -> None:
    """Both surfaces answer 503 QUEUE_UNAVAILABLE with Retry-After, each in its own envelope."""
    native = httpx.post(f"{gateway.url}/v1/encode/{MINILM}", json={"items": [{"text": "x"}]}, timeout=10)
    assert native.status_code == 503, native.text
    assert native.headers["x-sie-error-code"] == "QUEUE_UNAVAILABLE"
    assert native.headers["retry-after"] == "5"
    assert native.json()["error"]["code"] == "QUEUE_UNAVAILABLE"
    openai = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": MINILM, "input": "x"}, timeout=10)
    assert openai.status_code == 503, openai.text
    assert openai.headers["retry-after"] == "5"
    assert openai.json()["error"]["code"] == "QUEUE_UNAVAILABLE"
    assert openai.json()["error"]["type"] == "server_error"


def wait_warned(process: RoleProcess) -> None:
    """Until the role has logged that NATS is unreachable (its first connect attempt failed)."""
    assert holds_within(lambda: UNREACHABLE_LINE in process.log(), CONNECT_DEADLINE_S), process.log()


def assert_one_clear_warning(process: RoleProcess) -> None:
    log = process.log_path.read_text(errors="replace")
    assert log.count(UNREACHABLE_LINE) == 1, log
    assert "Traceback" not in log, log
    assert "connected to NATS at nats://127.0.0.1:" in log, log


async def publish_late(url: str) -> None:
    """A heartbeat and a config delta, sent once the gateway is connected: only its start-up subscriptions hear them."""
    model_yaml = f"sie_id: {LATE_MODEL}\nhf_id: {LATE_MODEL}\nprofiles:\n  default:\n    adapter_path: {DENSE}\n"
    heartbeat = WorkerHeartbeat(
        worker_id="w-late", pool="default", machine_profile="l4", bundle="default", ready=True, timestamp=time.time()
    )
    delta = ConfigNotification(
        router_id="sie-config", bundle_id="default", epoch=1, bundle_config_hash="", model_id=LATE_MODEL,
        model_config=model_yaml + "    max_batch_tokens: 64\n",
    )  # fmt: skip
    async with NatsTransport(NatsSettings(url=url)) as transport:
        await transport.publish(health_subject("w-late"), heartbeat)
        await transport.publish(CONFIG_ALL_SUBJECT, delta)
        await transport.flush()


def routes(gateway: Gateway) -> bool:
    """Whether the gateway's `/health` says requests can be routed (connected, first round of heartbeats over)."""
    return httpx.get(f"{gateway.url}/health", timeout=10).json()["routing"]["ready"] is True


def test_a_gateway_started_without_nats_answers_503_then_connects_by_itself(tmp_path: Path) -> None:
    nats_port, nats_url = nats_down(tmp_path / "nats")
    gateway = Gateway(tmp_path, nats_url)
    server: NatsServer | None = None
    try:
        gateway.process.wait_http_ready(f"{gateway.url}/healthz", timeout_s=60.0)
        wait_warned(gateway.process)
        assert gateway.status("/readyz") == 200  # the process serves: the load balancer keeps sending requests
        health = httpx.get(f"{gateway.url}/health", timeout=10).json()
        assert health["status"] == "degraded" and health["routing"]["ready"] is False
        assert f"NATS at {nats_url} is not connected (cannot connect to NATS at" in health["routing"]["reason"]
        assert_queue_unavailable(gateway)
        assert gateway.process.process.poll() is None

        server = NatsServer(tmp_path / "nats", port=nats_port)
        assert holds_within(lambda: routes(gateway), CONNECT_DEADLINE_S), gateway.process.log()
        # Reachable now: with no worker heard from yet the lane is PROVISIONING, no longer QUEUE_UNAVAILABLE.
        response = httpx.post(f"{gateway.url}/v1/encode/{MINILM}", json={"items": [{"text": "x"}]}, timeout=10)
        assert response.headers["x-sie-error-code"] == "PROVISIONING", response.text

        asyncio.run(publish_late(server.url))

        def heard() -> bool:
            workers = httpx.get(f"{gateway.url}/health", timeout=10).json()["workers"]
            return any(worker["name"] == "w-late" for worker in workers) and (
                gateway.status(f"/v1/configs/models/{LATE_MODEL}") == 200
            )

        assert holds_within(heard, 30.0), gateway.process.log()
        assert_one_clear_warning(gateway.process)
    finally:
        code = gateway.process.stop()
        if server is not None:
            server.stop()
    assert code == 0, gateway.process.log()


@pytest.mark.slow
def test_a_sidecar_and_gateway_started_without_nats_serve_once_it_comes_up(tmp_path: Path) -> None:
    nats_port, nats_url = nats_down(tmp_path / "nats")
    worker_env = {"SIE_IPC_SOCKET_PATH": str(tmp_path / "worker.sock"), "SIE_WORKER_ID": "w-1"}
    worker = RoleProcess("worker", ["--preload", MINILM], worker_env, tmp_path / "worker.log")
    probe_url = f"http://127.0.0.1:{free_port()}"
    sidecar_args = ["--host", "127.0.0.1", "--port", probe_url.rsplit(":", 1)[1], "--health-interval-s", "0.2"]
    sidecar = RoleProcess("sidecar", sidecar_args, {**worker_env, "SIE_NATS_URL": nats_url}, tmp_path / "sidecar.log")
    gateway = Gateway(tmp_path, nats_url)
    server: NatsServer | None = None
    try:
        sidecar.wait_http_ready(f"{probe_url}/healthz", timeout_s=60.0)
        gateway.process.wait_http_ready(f"{gateway.url}/healthz", timeout_s=60.0)
        # The sidecar has found its worker, and the worker has its model: only the broker keeps it from being ready.
        assert holds_within(lambda: "preloaded" in worker.log(), 120.0), worker.log()
        assert holds_within(lambda: "worker child worker-0 (cpu) is ready" in sidecar.log(), 60.0), sidecar.log()
        wait_warned(sidecar)
        wait_warned(gateway.process)
        assert httpx.get(f"{probe_url}/readyz", timeout=10).status_code == 503
        assert_queue_unavailable(gateway)

        server = NatsServer(tmp_path / "nats", port=nats_port)
        assert holds_within(
            lambda: httpx.get(f"{probe_url}/readyz", timeout=10).status_code == 200, CONNECT_DEADLINE_S
        ), sidecar.log()
        assert holds_within(lambda: routes(gateway), CONNECT_DEADLINE_S), gateway.process.log()

        answers: list[httpx.Response] = []

        def encodes() -> bool:  # once the gateway has heard the sidecar's first heartbeats
            body = {"items": [{"text": "Hello world"}]}
            answers.append(httpx.post(f"{gateway.url}/v1/encode/{MINILM}", json=body, timeout=60))
            return answers[-1].status_code == 200

        assert holds_within(encodes, 60.0, interval_s=0.2), (answers[-1].text, gateway.process.log(), sidecar.log())
        values = answers[-1].json()["items"][0]["dense"]["values"]
        assert np.allclose(values[:4], HELLO_WORLD_PREFIX, atol=1e-5)
        assert "attached to the consumer of lane default/" in sidecar.log()
        for process in (sidecar, gateway.process):
            assert_one_clear_warning(process)
    finally:
        codes = [gateway.process.stop(), sidecar.stop(), worker.stop()]
        if server is not None:
            server.stop()
    assert codes == [0, 0, 0], (gateway.process.log(), sidecar.log(), worker.log())
