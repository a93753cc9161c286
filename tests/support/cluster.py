"""A distributed deployment on loopback for end-to-end tests: nats-server, worker, sidecar and gateway as real
`sie run` processes, the worker preloading MiniLM; started together, stopped together."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from support.nats_server import NatsServer
from support.polling import holds_within
from support.servers import RoleProcess, free_port

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class Cluster:
    """The four processes of one distributed deployment. `worker_args` go to the worker (`--devices cpu:2`),
    `broker_env` to the roles on the broker (sidecar and gateway), `max_payload` to nats-server."""

    def __init__(
        self,
        root: Path,
        worker_args: tuple[str, ...] = (),
        *,
        broker_env: Mapping[str, str] | None = None,
        max_payload: int | None = None,
    ) -> None:
        self.root = root
        self.worker_args = list(worker_args)
        self.nats = NatsServer(root) if max_payload is None else NatsServer(root, max_payload=max_payload)
        self.socket = root / "worker.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Each role gets only the variables it reads (a role refuses the others).
        self.worker_env = {"SIE_IPC_SOCKET_PATH": str(self.socket), "SIE_WORKER_ID": "w-1"}
        broker = {"SIE_NATS_URL": self.nats.url, **(broker_env or {})}
        self.worker = self.start_worker()
        self.probe_url = f"http://127.0.0.1:{free_port()}"
        self.sidecar = RoleProcess(
            "sidecar", ["--port", self.probe_url.rsplit(":", 1)[1], "--health-interval-s", "0.2"],
            {**self.worker_env, **broker}, root / "sidecar.log",
        )  # fmt: skip
        self.gateway = RoleProcess(
            "gateway", ["--host", "127.0.0.1", "--port", str(self.port), "--gateway-request-timeout", "60"],
            broker, root / "gateway.log",
        )  # fmt: skip

    def start_worker(self) -> RoleProcess:
        log = self.root / f"worker-{time.monotonic()}.log"
        return RoleProcess("worker", ["--preload", MINILM, *self.worker_args], self.worker_env, log)

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
