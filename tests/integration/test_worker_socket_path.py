"""Where `sie run --role worker` serves its IPC socket (issue 14 §3): by default in a directory of this user's only,
which a sidecar started alike finds; a stale socket at the path is replaced; anything else there (a socket another
process listens on, a regular file, a directory) stops the worker at once with one line naming the path and exit
status 2, and is left as it was."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from launcher import RoleProcess, free_port
from sie.ipc.errors import IpcConnectionError
from sie.ipc.uds_client import UdsWorkerClient
from sie.wire.ipc_control import PingRequest
from support.polling import holds_within

# The null backend loads no model: the worker serves its socket a second or two after it starts.
WORKER_ARGS = ["--backend", "null", "--devices", "cpu"]
START_DEADLINE_S = 60.0


@pytest.fixture()
def directory() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~108 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="sie-sock-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_worker(directory: Path, args: list[str], env: dict[str, str] | None = None) -> RoleProcess:
    return RoleProcess("worker", [*WORKER_ARGS, *args], {"SIE_WORKER_ID": "w-1", **(env or {})}, directory / "w.log")


def ping(path: Path) -> str | None:
    """The worker id the worker serving `path` answers Ping with; None while nothing answers there."""

    async def call() -> str:
        async with UdsWorkerClient(path, timeout_s=10.0) as client:
            return (await client.ping(PingRequest(timestamp_ms=1.0))).worker_id

    try:
        return asyncio.run(call())
    except IpcConnectionError:
        return None


def wait_serving(worker: RoleProcess, path: Path) -> None:
    """Until the worker answers Ping on `path` as w-1."""

    def serving() -> bool:
        if worker.process.poll() is not None:
            raise AssertionError(f"the worker exited with {worker.process.returncode}:\n{worker.log()}")
        return ping(path) == "w-1"

    assert holds_within(serving, START_DEADLINE_S), worker.log()


def stops_with_one_line(worker: RoleProcess) -> str:
    """The worker's exit status is 2 and its output one `sie:` line; returns that line."""
    assert worker.process.wait(timeout=START_DEADLINE_S) == 2, worker.log()
    worker.stop()
    lines = worker.log().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sie: "), lines
    return lines[0]


def listening_socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def regular_file(path: Path) -> None:
    path.write_text("not a socket")


def directory_at(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(
    ("make", "says"),
    [(regular_file, "exists and is a regular file, not a socket"), (directory_at, "exists and is a directory")],
)
def test_something_that_is_no_socket_at_the_path_stops_the_worker(
    directory: Path, make: Callable[[Path], None], says: str
) -> None:
    path = directory / "worker.sock"
    make(path)
    line = stops_with_one_line(start_worker(directory, ["--socket", str(path)]))
    assert f"{path} {says}" in line and "SIE_IPC_SOCKET_PATH" in line
    assert os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode)


def test_a_socket_another_process_listens_on_stops_the_worker_and_keeps_serving(directory: Path) -> None:
    path = directory / "worker.sock"
    with listening_socket(path) as other:
        line = stops_with_one_line(start_worker(directory, ["--socket", str(path)]))
        assert f"another process is listening on {path}" in line
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # still the other process's socket
            connection, _ = other.accept()
            connection.close()


def test_a_taken_child_socket_stops_a_multi_device_worker_before_it_starts_children(directory: Path) -> None:
    path = directory / "worker.sock"
    regular_file(directory / "worker.sock.1")
    worker = start_worker(directory, ["--socket", str(path), "--devices", "cpu:2"])
    line = stops_with_one_line(worker)
    assert f"{path}.1 exists and is a regular file" in line
    assert not os.path.lexists(directory / "worker.sock.0")


def test_a_stale_socket_is_replaced(directory: Path) -> None:
    path = directory / "worker.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))  # bound, never listening: what a killed worker leaves
    worker = start_worker(directory, ["--socket", str(path)])
    try:
        wait_serving(worker, path)
    finally:
        code = worker.stop()
    assert code == 0, worker.log()
    assert not os.path.lexists(path)  # the worker removed its own socket on the way out


def test_by_default_the_worker_serves_in_a_private_directory_the_sidecar_finds(directory: Path) -> None:
    # No XDG_RUNTIME_DIR: the per-user directory under TMPDIR, created 0700 for this user.
    env = {"TMPDIR": str(directory), "XDG_RUNTIME_DIR": ""}
    private = directory / f"sie-{os.getuid()}"
    worker = start_worker(directory, [], env)
    probe = f"http://127.0.0.1:{free_port()}"
    sidecar_env = {**env, "SIE_WORKER_ID": "w-1", "SIE_NATS_URL": f"nats://127.0.0.1:{free_port()}"}  # no broker
    sidecar = RoleProcess(
        "sidecar", ["--host", "127.0.0.1", "--port", probe.rsplit(":", 1)[1]], sidecar_env, directory / "s.log"
    )
    try:
        wait_serving(worker, private / "worker.sock")
        info = os.stat(private)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.getuid(), 0o700)

        def sidecar_found_it() -> bool:  # its placement surface lists the worker ready, found on the default path
            try:
                children = httpx.get(f"{probe}/v1/placement", timeout=5).json()["children"]
            except httpx.HTTPError:
                return False
            return [(child["name"], child["ready"]) for child in children] == [("worker-0", True)]

        assert holds_within(sidecar_found_it, START_DEADLINE_S), sidecar.log()
    finally:
        codes = [sidecar.stop(), worker.stop()]
    assert codes == [0, 0], (sidecar.log(), worker.log())
