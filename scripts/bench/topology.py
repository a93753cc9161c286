"""The serving topologies the benchmarks compare, started with the shared launcher (`scripts/launcher.py`) as real
processes on loopback: `all` (one `sie run --role all`) and `distributed` (nats-server + worker + sidecar + gateway).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher import HOST, Cluster, RoleProcess, free_port, start_all  # noqa: E402

__all__ = ["HOST", "Topology", "start_all"]


class Topology:
    """One running topology: `url` serves the HTTP API; `stop()` ends every process.

    `source` is another checkout's `src/` directory to run instead of this one (before/after comparisons in one
    run; its catalogue is that checkout's `config/`), on this checkout's virtual environment. `env` goes to every
    `sie run` process (not to nats-server); a PYTHONPATH in it comes before `source`.
    """

    def __init__(  # noqa: PLR0913 - a topology's options, each with a default but the first four
        self,
        kind: str,
        model: str,
        backend: str,
        extra: list[str],
        http_server: str = "hypercorn",
        source: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.model = model
        self.http_server = http_server
        self.source = source
        self.directory = Path(tempfile.mkdtemp(prefix=f"sie-bench-{kind}-"))
        self._server: RoleProcess | None = None
        self._cluster: Cluster | None = None
        extra_env = dict(env or {})
        paths = [path for path in (extra_env.pop("PYTHONPATH", None), source) if path is not None]
        if paths:
            extra_env["PYTHONPATH"] = ":".join(str(path) for path in paths)
        server = {"SIE_HTTP_SERVER": http_server}
        worker_args = ["--backend", backend, *extra]
        if kind == "all":
            server.update(extra_env)
            port = free_port()
            args = ["--host", HOST, "--port", str(port), "--preload", model, *worker_args]
            self._server = RoleProcess("all", args, server, self.directory / "all.log")
            self.url = f"http://{HOST}:{port}"
            return
        roles, broker = extra_env, {}
        if source is not None:
            # Sidecars of the first wave read their probe port from this variable, not --port (default 9095, so
            # two of them would collide); today's reads --port, which the Cluster passes.
            broker["SIE_WORKER_PROBE_PORT"] = str(free_port())
        self._cluster = Cluster(
            self.directory, worker_args, model=model, role_env=roles, broker_env=broker, gateway_env=server
        )
        self.url = self._cluster.url

    def wait_serving(self, model: str, timeout_s: float = 180.0) -> None:
        try:
            if self._cluster is not None:
                self._cluster.wait_serving(timeout_s)
            elif self._server is not None:
                self._server.wait_http_ready(f"{self.url}/readyz", timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            raise SystemExit(f"{self.kind} topology did not start; logs in {self.directory}") from exc

    def pids(self) -> list[int]:
        """The processes of the topology (the broker included): what its CPU time is read from."""
        if self._server is not None:
            return [self._server.pid]
        if self._cluster is None:
            return []
        pids = [process.pid for process in self._cluster.roles.values()]
        pids += [node.process.pid for node in self._cluster.brokers.nodes.values()]
        return pids

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
        if self._server is not None:
            self._server.stop()
