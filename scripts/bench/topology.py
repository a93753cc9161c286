"""Start and stop the serving topologies the benchmarks compare, as real processes on loopback:
`all` (one `sie run --role all`) and `distributed` (nats-server + worker + sidecar + gateway)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


MODEL_ROLES = ("worker", "all")


def start_role(role: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`sie run --role ROLE ARGS` writing to `log`. A role refuses SIE_* variables it does not read: each gets
    this environment's SIE_MODEL_CACHE only if it loads models, then `env`."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("SIE_")}
    if role in MODEL_ROLES and "SIE_MODEL_CACHE" in os.environ:
        clean["SIE_MODEL_CACHE"] = os.environ["SIE_MODEL_CACHE"]
    command = [sys.executable, "-m", "sie.cli.main", "run", "--role", role, *args]
    with log.open("wb") as output:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env={**clean, **env})


def start_all(
    args: list[str], env: dict[str, str], log: Path, timeout_s: float = 300.0
) -> tuple[subprocess.Popen, str]:
    """`sie run --role all` on a free loopback port with `args` and `env`, once its /readyz answers 200; returns
    the process and its base URL (SystemExit, with the log's path, if it exits or does not get ready)."""
    port = free_port()
    process = start_role("all", ["--host", HOST, "--port", str(port), *args], env, log)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise SystemExit(f"the server exited; log in {log}")
        time.sleep(0.25)  # polling readiness with a deadline
    process.kill()
    raise SystemExit(f"the server did not get ready; log in {log}")


def start_nats(directory: Path, port: int = -1) -> tuple[subprocess.Popen, str]:
    """nats-server with JetStream stored under `directory/js`, on `port` (-1: one it picks); returns it and its
    URL once it listens. Started again with the same directory and port, it finds its streams where they were."""
    binary = Path(sys.executable).parent / "nats-server"
    command = [
        str(binary),
        "-a",
        HOST,
        "-p",
        str(port),
        "-js",
        "-sd",
        str(directory / "js"),
        "--ports_file_dir",
        str(directory),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = directory / f"nats-server_{process.pid}.ports"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if ports.exists():
            try:
                return process, json.loads(ports.read_text())["nats"][0]
            except (ValueError, KeyError, IndexError):
                pass
        time.sleep(0.01)  # polling the ports file with a deadline
    process.kill()
    raise SystemExit("nats-server did not start")


class Topology:
    """One running topology: `url` serves the HTTP API; `stop()` ends every process.

    `source` is another checkout's `src/` directory to run instead of this one (an `all` topology only, for
    before/after comparisons in one run; its catalogue is that checkout's `config/`).
    """

    def __init__(
        self,
        kind: str,
        model: str,
        backend: str,
        extra: list[str],
        http_server: str = "hypercorn",
        source: Path | None = None,
    ) -> None:
        self.kind = kind
        self.http_server = http_server
        self.source = source
        self.directory = Path(tempfile.mkdtemp(prefix=f"sie-bench-{kind}-"))
        self.processes: list[subprocess.Popen] = []
        port = free_port()
        self.url = f"http://{HOST}:{port}"
        http = ["--host", HOST, "--port", str(port)]
        common = ["--preload", model, "--backend", backend]
        server = {"SIE_HTTP_SERVER": http_server}
        if source is not None:
            server["PYTHONPATH"] = str(source)
        if kind == "all":
            self.processes.append(start_role("all", http + common + extra, server, self.directory / "all.log"))
            return
        if source is not None:
            raise SystemExit("--compare-src runs the `all` topology only")
        nats, nats_url = start_nats(self.directory)
        self.processes.append(nats)
        socket_env = {"SIE_IPC_SOCKET_PATH": str(self.directory / "worker.sock")}
        nats_env = {"SIE_NATS_URL": nats_url}
        self.processes.append(start_role("worker", common + extra, socket_env, self.directory / "worker.log"))
        sidecar_args = ["--port", str(free_port())]
        self.processes.append(
            start_role("sidecar", sidecar_args, socket_env | nats_env, self.directory / "sidecar.log")
        )
        self.processes.append(start_role("gateway", http, nats_env | server, self.directory / "gateway.log"))

    def wait_serving(self, model: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        body = {"items": [{"text": "warm up"}]}
        while time.monotonic() < deadline:
            try:
                if httpx.post(f"{self.url}/v1/encode/{model}", json=body, timeout=30).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)  # polling readiness with a deadline
        raise SystemExit(f"{self.kind} topology did not start; logs in {self.directory}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
