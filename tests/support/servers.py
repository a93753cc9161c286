"""Start `sie run` roles as real subprocesses on free loopback ports, and stop them gracefully."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

from support.polling import holds_within

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MODEL_ROLES = ("worker", "all")


def role_environment(role: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a role subprocess: this one's without any SIE_* variable (each test names what its role
    reads), the repository's model cache for the roles that load models, then `env`."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("SIE_")}
    if role in MODEL_ROLES:
        clean["SIE_MODEL_CACHE"] = str(REPO / ".cache" / "models")
    return {**clean, **env}


class RoleProcess:
    """One `sie run --role ROLE` subprocess; its stderr goes to a log file kept for failure reports."""

    def __init__(
        self,
        role: str,
        args: list[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        sie: Sequence[str] = (sys.executable, "-m", "sie.cli.main"),
        cwd: Path | None = None,
    ) -> None:
        """`sie` is the command that runs the CLI (another installation's `bin/sie`), `cwd` where it starts."""
        self.log_path = log_path
        command = [*sie, "run", "--role", role, *args]
        environment = role_environment(role, env)
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=environment, cwd=cwd)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_http_ready(self, url: str, timeout_s: float = 120.0) -> None:
        """Poll `url` until it answers 200, the process dies, or the deadline passes."""

        def answers_ok() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"process exited with {self.process.returncode}:\n{self.log()}")
            try:
                return httpx.get(url, timeout=2.0).status_code == 200
            except httpx.HTTPError:
                return False

        if not holds_within(answers_ok, timeout_s, interval_s=0.1):
            raise TimeoutError(f"{url} not ready after {timeout_s} s:\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code (kills after the timeout)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


@contextlib.contextmanager
def serving_all(log_path: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`sie run --role all ARGS` with `env` on a free loopback port; yields its base URL once `/readyz` answers 200,
    and on exit requires it to stop with status 0 after SIGTERM (a graceful shutdown)."""
    port = free_port()
    server = RoleProcess("all", ["--host", "127.0.0.1", "--port", str(port), *args], env or {}, log_path)
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        yield f"http://127.0.0.1:{port}"
    finally:
        code = server.stop()
    assert code == 0, server.log()
