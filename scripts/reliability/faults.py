"""The fault scenarios of issue 13 §4 on real processes: a distributed cluster (nats-server with JetStream file
storage, `sie run --role worker|sidecar|gateway`, all-MiniLM-L6-v2) whose parts are killed and started again
while `load.Load` clients check every answer. Shared by `report.py` and `tests/fault/`.

Scenarios: `none` (the load alone, for comparison), `worker`, `sidecar`, `gateway` (kill -9, started again
RESTART_DELAY_S later), `nats` (the broker stopped and started again on the same port and store), `nats_down` (the
roles start while the broker is down, the load begins once gateway and sidecar listen, the broker comes up
`fault_at_s` into it). Each returns one `Tally`; recovery counts from the fault (the kill, the stop, or the broker's
start).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from load import MODEL, Load, LoadOptions, References, Tally, make_texts

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
from topology import HOST, free_port, start_nats, start_role  # noqa: E402

SCENARIOS = ("none", "worker", "sidecar", "nats", "gateway", "nats_down")
# A killed role is started again this long after the kill (the goal: restarted within 5 s).
RESTART_DELAY_S = 2.0
SERVING_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
WORKER_ID = "w-1"
ROLES = ("worker", "sidecar", "gateway")


class Cluster:
    """nats-server + worker + sidecar + gateway on loopback, each killable and startable again on the same
    ports, socket and store. `gateway_timeout_s` is the gateway's request timeout."""

    def __init__(self, directory: Path, *, gateway_timeout_s: float = 30.0, broker_up: bool = True) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.gateway_timeout_s = gateway_timeout_s
        self.nats_port = free_port()
        self.nats_url = f"nats://{HOST}:{self.nats_port}"
        self.url = f"http://{HOST}:{free_port()}"
        self.probe_port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self._starts = 0
        if broker_up:
            self.start("nats")
        for role in ROLES:
            self.start(role)

    def start(self, role: str) -> None:
        """Start `role` ("nats" or a sie role) with the same ports, socket and store as before."""
        self._starts += 1
        if role == "nats":
            self.processes["nats"], _ = start_nats(self.directory, self.nats_port)
            return
        log = self.directory / f"{role}-{self._starts}.log"
        self.processes[role] = start_role(role, *self._role_arguments(role), log)

    def kill(self, role: str) -> None:
        """kill -9, and reap it."""
        process = self.processes[role]
        process.kill()
        process.wait()

    def stop(self, role: str) -> None:
        """SIGTERM, and wait (killed after STOP_TIMEOUT_S)."""
        process = self.processes[role]
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        for role in ("gateway", "sidecar", "worker", "nats"):
            if role in self.processes:
                self.stop(role)

    def exited(self) -> list[str]:
        """The roles whose process has ended, with their exit codes."""
        ended = [(role, process.poll()) for role, process in self.processes.items()]
        return [f"{role} ({code})" for role, code in ended if code is not None]

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> None:
        """Return once an encode answers 200 (blocking); RuntimeError naming the logs otherwise."""
        deadline = time.monotonic() + timeout_s
        body = {"items": [{"text": "ping"}]}
        while time.monotonic() < deadline:
            try:
                if httpx.post(f"{self.url}/v1/encode/{MODEL}", json=body, timeout=30).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.exited():
                break
            time.sleep(0.25)  # polling readiness with a deadline
        raise RuntimeError(f"cluster not serving (exited: {self.exited()}); logs in {self.directory}")

    def wait_listening(self, timeout_s: float = SERVING_TIMEOUT_S) -> None:
        """Return once the gateway and the sidecar answer HTTP at all (with or without a broker)."""
        deadline = time.monotonic() + timeout_s
        urls = [f"{self.url}/healthz", f"http://{HOST}:{self.probe_port}/healthz"]
        while time.monotonic() < deadline and not self.exited():
            try:
                for url in urls:
                    httpx.get(url, timeout=5)
                return
            except httpx.HTTPError:
                time.sleep(0.25)  # polling with a deadline
        raise RuntimeError(f"gateway or sidecar not listening (exited: {self.exited()}); logs in {self.directory}")

    def _role_arguments(self, role: str) -> tuple[list[str], dict[str, str]]:
        socket = {"SIE_IPC_SOCKET_PATH": str(self.directory / "worker.sock"), "SIE_WORKER_ID": WORKER_ID}
        broker = {"SIE_NATS_URL": self.nats_url, "SIE_STREAM_STORAGE": "file"}
        if role == "worker":
            cache = os.environ.get("SIE_MODEL_CACHE", str(REPO / ".cache" / "models"))
            return ["--preload", MODEL], {**socket, "SIE_MODEL_CACHE": cache}
        if role == "sidecar":
            return ["--host", HOST, "--port", str(self.probe_port)], {**socket, **broker}
        port = self.url.rsplit(":", 1)[1]
        timeout = str(self.gateway_timeout_s)
        return ["--host", HOST, "--port", port, "--gateway-request-timeout", timeout], broker


async def inject(cluster: Cluster, scenario: str) -> float:
    """Cause `scenario`'s fault and undo it (`nats_down`: start the broker); returns the monotonic time of the
    fault. Process control runs in a thread: the clients share this event loop."""
    fault_at = time.monotonic()
    if scenario == "none":
        return fault_at
    if scenario == "nats":
        await asyncio.to_thread(cluster.stop, "nats")
    elif scenario != "nats_down":
        await asyncio.to_thread(cluster.kill, scenario)
        await asyncio.sleep(RESTART_DELAY_S)
    await asyncio.to_thread(cluster.start, "nats" if scenario.startswith("nats") else scenario)
    return fault_at


async def run_scenario(cluster: Cluster, scenario: str, references: References, options: LoadOptions) -> Tally:
    """Load the cluster, cause the fault `options.fault_at_s` after every client's first call ended, keep
    loading to `options.duration_s` from then (with `options.settle_s`: until that long after the first call sent
    once the fault was undone is answered), let every call end and count how they did."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}")
    if scenario == "nats_down":  # the roles have started without a broker: that is the fault
        await asyncio.to_thread(cluster.wait_listening)
    load = Load(cluster.url, references, options)
    load.start()
    try:
        if scenario != "nats_down":  # with no broker no call ends before the fault
            await load.warmed_up()
        started = time.monotonic()
        await asyncio.sleep(options.fault_at_s)
        fault_at = await inject(cluster, scenario)
        await load.last_until_settled(started, undone_at=time.monotonic())
    finally:
        await load.stop()
    return load.tally(scenario, fault_at)


async def reference_cluster(directory: Path, options: LoadOptions) -> References:
    """References for `options`' texts, from a cluster started for the purpose (then stopped)."""
    cluster = Cluster(directory)
    try:
        await asyncio.to_thread(cluster.wait_serving)
        return await References.compute(cluster.url, make_texts(options.text_count))
    finally:
        await asyncio.to_thread(cluster.close)
