"""A distributed deployment on loopback for end-to-end tests: nats-server, worker, sidecar and gateway as real
`sie run` processes, the worker preloading MiniLM; started together, stopped together."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from support.nats_server import NatsServer
from support.polling import holds_within
from support.servers import RoleProcess, free_port

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class Cluster:
    """The four processes of one distributed deployment. `worker_args` go to the worker (`--devices cpu:2`),
    `broker_env` to the roles on the broker (sidecar and gateway), `role_env` to the worker, sidecar and gateway
    (telemetry settings), `gateway_env` to the gateway alone, `max_payload` to nats-server, `health_interval_s` (the
    heartbeat period) to the sidecar and the gateway."""

    def __init__(
        self,
        root: Path,
        worker_args: tuple[str, ...] = (),
        *,
        broker_env: Mapping[str, str] | None = None,
        max_payload: int | None = None,
        health_interval_s: float = 0.2,
        role_env: Mapping[str, str] | None = None,
        gateway_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.worker_args = list(worker_args)
        self.nats = NatsServer(root) if max_payload is None else NatsServer(root, max_payload=max_payload)
        self.socket = root / "worker.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Each role gets only the variables it reads (a role refuses the others).
        self.worker_env = {"SIE_IPC_SOCKET_PATH": str(self.socket), "SIE_WORKER_ID": "w-1", **(role_env or {})}
        self.broker_env = {"SIE_NATS_URL": self.nats.url, **(role_env or {}), **(broker_env or {})}
        self.health_interval = ["--health-interval-s", str(health_interval_s)]
        self.gateway_env = {**self.broker_env, **(gateway_env or {})}
        self.worker = self.start_worker()
        self.probe_url = f"http://127.0.0.1:{free_port()}"
        self.sidecar = RoleProcess(
            "sidecar", ["--host", "127.0.0.1", "--port", self.probe_url.rsplit(":", 1)[1], *self.health_interval],
            {**self.worker_env, **self.broker_env}, root / "sidecar.log",
        )  # fmt: skip
        self.gateway = self.start_gateway()

    def start_worker(self) -> RoleProcess:
        log = self.root / f"worker-{time.monotonic()}.log"
        return RoleProcess("worker", ["--preload", MINILM, *self.worker_args], self.worker_env, log)

    def start_gateway(self) -> RoleProcess:
        """A gateway on the cluster's port (the one before must have stopped)."""
        args = ["--host", "127.0.0.1", "--port", str(self.port), "--gateway-request-timeout", "60"]
        log = self.root / f"gateway-{time.monotonic()}.log"
        return RoleProcess("gateway", [*args, *self.health_interval], self.gateway_env, log)

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        self.gateway.wait_http_ready(f"{self.url}/readyz")

        def encodes() -> bool:  # once the worker has registered through its first heartbeats
            response = httpx.post(f"{self.url}/v1/encode/{MINILM}", json={"items": [{"text": "ping"}]}, timeout=60)
            return response.status_code == 200

        if not holds_within(encodes, timeout_s, interval_s=0.2):
            raise TimeoutError(f"cluster not serving:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(process.log() for process in (self.gateway, self.sidecar, self.worker))

    def stop(self) -> None:
        for process in (self.gateway, self.sidecar, self.worker):
            process.stop()
        self.nats.stop()


@contextlib.contextmanager
def serving_cluster(root: Path, worker_args: tuple[str, ...] = (), **options: Any) -> Iterator[Cluster]:
    """A Cluster in `root` (options as Cluster's), once it serves MiniLM; stopped on exit."""
    deployment = Cluster(root, worker_args, **options)
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.stop()
