"""One worker child per device: `sie run --role worker --devices cpu:2` supervises two children on `{socket}.0`
and `{socket}.1` (restarting one that dies, stopping both on SIGTERM), and `--role all`'s `open_local_workers`
builds one manager per device with the cores split between them."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from launcher import REPO, RoleProcess
from sie.ipc.uds_client import UdsWorkerClient
from sie.roles.local_workers import open_local_workers
from sie.roles.serving import baseline_catalog
from sie.settings import load_role_settings
from sie.wire.ipc_control import MODEL_STATE_READY, ModelControlStatusRequest, PingRequest
from sie.worker.devices import Host
from support.polling import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture()
def socket_path() -> Iterator[Path]:
    directory = tempfile.mkdtemp(prefix="sie-children-", dir="/tmp")
    yield Path(directory) / "worker.sock"
    shutil.rmtree(directory, ignore_errors=True)


def child_pids(parent: int) -> dict[str, int]:
    """`{socket path: pid}` of the worker children of `parent`, read from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # it ended while we looked
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) != parent or fields[0] == "Z":
            continue
        for variable in environ:
            if variable.startswith(b"SIE_IPC_SOCKET_PATH="):
                children[variable.split(b"=", 1)[1].decode()] = int(entry)
    return children


def existing(paths: list[Path]) -> list[Path]:
    return [path for path in paths if path.exists()]


async def answers(path: Path) -> str | None:
    """The worker id that answers Ping on `path`, or None while nothing does."""
    async with UdsWorkerClient(path, timeout_s=2.0) as client:
        try:
            return (await client.ping(PingRequest(timestamp_ms=1.0))).worker_id
        except Exception:  # noqa: BLE001 - any IPC failure means "not answering yet"
            return None


@pytest.mark.slow
async def test_a_worker_on_two_cpu_devices_supervises_two_children(socket_path: Path, tmp_path: Path) -> None:
    args = ["--devices", "cpu:2", "--socket", str(socket_path)]
    env = {"SIE_WORKER_ID": "pod", "SIE_SHUTDOWN_GRACE_S": "10"}
    worker = RoleProcess("worker", args, env, tmp_path / "worker.log")
    sockets = [Path(f"{socket_path}.0"), Path(f"{socket_path}.1")]
    try:
        for index, path in enumerate(sockets):
            await eventually(lambda path=path: answers(path), timeout_s=60.0, interval_s=0.1, what=f"{path}")
            assert await answers(path) == f"pod-{index}", worker.log()
            async with UdsWorkerClient(path) as client:
                status = await client.model_control_status(ModelControlStatusRequest())
            assert (status.worker_id, status.device, status.ready) == (f"pod-{index}", "cpu", True)
            assert status.memory_budget_bytes and status.memory_budget_bytes > 0
            assert status.models == [] and status.compute_seconds_total == 0.0
        assert existing([socket_path]) == []  # several children: no socket of the bare name

        pids = child_pids(worker.process.pid)
        assert set(pids) == {str(path) for path in sockets}, worker.log()
        os.kill(pids[str(sockets[0])], signal.SIGKILL)
        await eventually(
            lambda: child_pids(worker.process.pid).get(str(sockets[0])) not in (None, pids[str(sockets[0])]),
            timeout_s=30.0, interval_s=0.1, what="child 0 restarted",
        )  # fmt: skip
        await eventually(lambda: answers(sockets[0]), timeout_s=60.0, interval_s=0.1, what="child 0 answering again")
        assert child_pids(worker.process.pid)[str(sockets[1])] == pids[str(sockets[1])]  # the other one untouched
        survivors = list(child_pids(worker.process.pid).values())
    finally:
        code = worker.stop()
    log = worker.log()
    assert code == 0, log
    assert "restarting it in 1 s" in log and "killed by SIGKILL" in log
    assert existing([Path(f"/proc/{pid}") for pid in survivors]) == [], log
    assert existing(sockets) == []  # each child removed its socket on the way out


@pytest.mark.slow
async def test_devices_the_host_lacks_exit_with_status_2_and_one_line(tmp_path: Path) -> None:
    worker = RoleProcess("worker", ["--devices", "cuda:7"], {}, tmp_path / "worker.log")
    assert worker.process.wait(timeout=60) == 2
    worker.stop()
    lines = worker.log().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sie: devices 'cuda:7'"), lines


async def test_open_local_workers_gives_each_cpu_device_its_own_manager_and_half_the_cores() -> None:
    settings = load_role_settings(
        ["--role", "all", "--devices", "cpu:2", "--preload", MINILM],
        {"SIE_MODEL_CACHE": str(REPO / ".cache" / "models"), "SIE_WORKER_ID": "pod", "SIE_HF_FALLBACK": "false"},
    )
    half = max(1, Host.probe().cores // 2)
    async with AsyncExitStack() as stack:
        workers = await open_local_workers(stack, settings, baseline_catalog(settings))
        assert [(worker.name, worker.device) for worker in workers] == [("worker-0", "cpu"), ("worker-1", "cpu")]
        assert workers[0].manager is not workers[1].manager
        assert [worker.service.worker_id for worker in workers] == ["pod-0", "pod-1"]
        for worker in workers:
            loaded = worker.manager.get(MINILM)  # preloaded on every child
            assert loaded is not None
            assert loaded.adapter.session.get_session_options().intra_op_num_threads == half
            budget = worker.manager.memory_budget_bytes
            assert budget is not None and budget > loaded.memory_bytes
            status = await worker.service.model_control_status(ModelControlStatusRequest())
            assert [(entry.model_id, entry.state) for entry in status.models] == [(MINILM, MODEL_STATE_READY)]
        assert workers[0].service.runner.executor is not workers[1].service.runner.executor
