"""The config control plane with real processes: nats-server, `sie run --role config|gateway|sidecar|worker`.
`sie config apply` a new model → the gateway learns it (delta, or poll when the delta is lost) → the
worker applies it and acks → `sie config status --wait` returns → inference on it works. Restarting the
config service keeps its epoch with a store and rewinds it without one. Marked slow."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import NatsServer, RoleProcess, free_port
from support.model_files import minilm_copy
from support.polling import holds_within

pytestmark = pytest.mark.slow

HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]


def sie_config(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sie.cli.main", "config", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


class ControlPlane:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.nats = NatsServer(root)
        self.config_port, self.gateway_port = free_port(), free_port()
        self.config_url = f"http://127.0.0.1:{self.config_port}"
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.store = root / "store"
        self.config = self.start_config(with_nats=True, with_store=True)
        # Each role gets only the variables it reads (a role refuses the others).
        worker_env = {"SIE_IPC_SOCKET_PATH": str(root / "w.sock"), "SIE_WORKER_ID": "w-1"}
        self.worker = RoleProcess("worker", [], worker_env, root / "worker.log")
        self.sidecar = RoleProcess("sidecar", ["--port", str(free_port()), "--health-interval-s", "0.2"],
                                   {**worker_env, "SIE_NATS_URL": self.nats.url}, root / "sidecar.log")  # fmt: skip
        gateway_env = {
            "SIE_NATS_URL": self.nats.url, "SIE_CONFIG_SERVICE_URL": self.config_url, "SIE_CONFIG_POLL_INTERVAL_S": "1"
        }  # fmt: skip
        self.gateway = RoleProcess("gateway", ["--host", "127.0.0.1", "--port", str(self.gateway_port)],
                                   gateway_env, root / "gateway.log")  # fmt: skip

    def start_config(self, *, with_nats: bool, with_store: bool) -> RoleProcess:
        env = {"SIE_CONFIG_RESTORE": "true"}
        if with_nats:
            env["SIE_NATS_URL"] = self.nats.url
        if with_store:
            env["SIE_CONFIG_STORE_DIR"] = str(self.store)
        args = ["--host", "127.0.0.1", "--port", str(self.config_port)]
        process = RoleProcess("config", args, env, self.root / f"config-{time.monotonic()}.log")
        process.wait_http_ready(f"{self.config_url}/readyz")
        return process

    def restart_config(self, *, with_nats: bool, with_store: bool) -> None:
        self.config.stop()
        self.config = self.start_config(with_nats=with_nats, with_store=with_store)

    def gateway_knows(self, model_id: str, timeout_s: float = 30.0) -> bool:
        url = f"{self.gateway_url}/v1/configs/models/{model_id}"
        return holds_within(lambda: httpx.get(url, timeout=5).status_code == 200, timeout_s, interval_s=0.1)

    def gateway_epoch(self, model_id: str) -> int:
        return httpx.get(f"{self.gateway_url}/v1/configs/models/{model_id}/status", timeout=5).json()["config_epoch"]

    def stop(self) -> None:
        for process in (self.gateway, self.sidecar, self.worker, self.config):
            process.stop()
        self.nats.stop()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    control = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        control.gateway.wait_http_ready(f"{control.gateway_url}/readyz")
        control.gateway.wait_gateway_routing(control.gateway_url)  # connected to NATS: config deltas reach it
        yield control
    finally:
        control.stop()


def test_apply_propagates_to_gateway_and_worker_and_serves(plane: ControlPlane) -> None:
    path = minilm_copy(plane.root, "acme/minilm-live")
    applied = sie_config("apply", str(path), "--url", plane.config_url, "--idempotency-key", "k-1")
    assert applied.returncode == 0, applied.stderr
    assert '"created_profiles"' in applied.stdout
    assert plane.gateway_knows("acme/minilm-live")
    status = sie_config("status", "acme/minilm-live", "--gateway", plane.gateway_url, "--wait", "--timeout", "60")
    assert status.returncode == 0, status.stdout + status.stderr
    response = httpx.post(
        f"{plane.gateway_url}/v1/encode/acme/minilm-live", json={"items": [{"text": "Hello world"}]}, timeout=60
    )
    assert response.status_code == 200, response.text
    assert np.allclose(response.json()["items"][0]["dense"]["values"][:4], HELLO_WORLD_PREFIX, atol=1e-5)
    ack = httpx.get(f"{plane.gateway_url}/v1/configs/models/acme/minilm-live/status", timeout=5).json()
    expected = ack["bundles"][0]["expected_bundle_config_hash"]
    assert len(expected) == 64
    assert response.headers["x-sie-model-revision"] == expected


def test_a_lost_delta_is_caught_up_by_the_poller(plane: ControlPlane) -> None:
    plane.restart_config(with_nats=False, with_store=True)  # writes now publish nothing
    applied = sie_config("apply", str(minilm_copy(plane.root, "acme/minilm-polled")), "--url", plane.config_url)
    assert applied.returncode == 0, applied.stderr
    assert plane.gateway_knows("acme/minilm-polled")


def test_restart_keeps_the_epoch_with_a_store_and_rewinds_without(plane: ControlPlane) -> None:
    epoch_before = httpx.get(f"{plane.config_url}/v1/configs/epoch", timeout=5).json()["epoch"]
    assert epoch_before >= 2
    plane.restart_config(with_nats=True, with_store=True)
    assert httpx.get(f"{plane.config_url}/v1/configs/epoch", timeout=5).json()["epoch"] == epoch_before
    assert httpx.get(f"{plane.config_url}/v1/configs/models/acme/minilm-live", timeout=5).status_code == 200
    plane.restart_config(with_nats=True, with_store=False)
    assert httpx.get(f"{plane.config_url}/v1/configs/epoch", timeout=5).json()["epoch"] == 0
    # The gateway force-resets to the rewound control plane.
    holds_within(lambda: not plane.gateway_knows("acme/minilm-live", timeout_s=0.5), 30, interval_s=0.2)
    assert not plane.gateway_knows("acme/minilm-live", timeout_s=0.5)
    assert plane.gateway_epoch("sentence-transformers/all-MiniLM-L6-v2") == 0
