"""`sie run --role worker`: the model backend behind the IPC server on SIE_IPC_SOCKET_PATH; it never
touches NATS. The sidecar in the same pod dials the socket.

On one device the worker serves in this process. On several (SIE_WORKER_DEVICES) this process supervises one
`sie run --role worker` child per device, child i serving `{SIE_IPC_SOCKET_PATH}.{i}` as `{SIE_WORKER_ID}-{i}`;
the sidecar finds the children by those socket names. A socket path that is taken (another worker listening, a
file that is no socket, a directory of another user) stops the start with one line naming it and exit status 2.
"""

from __future__ import annotations

import functools
import logging
import sys
from contextlib import AsyncExitStack
from pathlib import Path

from sie.ipc.server import IpcServer
from sie.ipc.sockets import (
    SocketPathError,
    child_socket_path,
    child_socket_paths,
    claim_socket_path,
    remove_stale_sockets,
)
from sie.roles.local_workers import open_local_workers
from sie.roles.serving import baseline_catalog, open_tracing, run_main
from sie.runtime import freeze_startup_heap, wait_for_signal
from sie.runtime.children import ChildSpec, ChildSupervisor
from sie.settings import Settings, child_environment
from sie.worker.devices import CPU, Device, DeviceError, memory_budget, resolve_devices

logger = logging.getLogger(__name__)


async def serve_worker(settings: Settings, device: Device) -> None:
    catalog = baseline_catalog(settings)
    worker_id, socket_path = settings.process.worker_id, settings.worker.socket_path
    async with AsyncExitStack() as stack:
        tracing = open_tracing(stack, settings, "sie-worker")
        (local,) = await open_local_workers(stack, settings, catalog, [device], tracing)
        freeze_startup_heap()
        await stack.enter_async_context(IpcServer(local.service, socket_path, worker_id=worker_id))
        logger.info("worker %s serving IPC on %s (%s)", worker_id, socket_path, device.name)
        await wait_for_signal()
        logger.info("worker %s shutting down", worker_id)


def worker_children(settings: Settings, devices: list[Device]) -> list[ChildSpec]:
    """One `sie run --role worker` child per device, with this process's settings and its own device, socket,
    worker id, share of the cores and (on CPU, or when configured) memory budget."""
    worker, worker_id = settings.worker, settings.process.worker_id
    command = (sys.executable, "-m", "sie.cli.main", "run", "--role", "worker")
    cpu_children = sum(1 for device in devices if device.kind == CPU)
    children = []
    for index, device in enumerate(devices):
        overrides: dict[str, object] = {
            "worker.devices": device.name,
            "worker.socket_path": str(child_socket_path(worker.socket_path, index)),
            "process.worker_id": f"{worker_id}-{index}",
            "worker.intra_op_threads": worker.intra_op_threads or device.intra_op_threads,
        }
        if device.kind == CPU or worker.memory_budget_bytes is not None:
            # A CUDA child measures its own GPU's free memory when it starts.
            overrides["worker.memory_budget_bytes"] = memory_budget(
                device, worker.memory_budget_bytes, cpu_children=cpu_children
            )
        env = child_environment(settings, "worker", overrides)
        children.append(ChildSpec(f"worker-{index}", command, env))
    return children


async def supervise_workers(settings: Settings, devices: list[Device]) -> None:
    children = worker_children(settings, devices)
    async with ChildSupervisor(children, settings.process.shutdown_grace_s):
        logger.info("supervising %d worker children on %s, serving %s.0 to .%d", len(children),
                    ", ".join(device.name for device in devices), settings.worker.socket_path,
                    len(children) - 1)  # fmt: skip
        await wait_for_signal()
        logger.info("stopping %d worker children", len(children))


def claim_own_sockets(socket_path: Path, devices: list[Device]) -> None:
    """Before any model loads: the socket (one device) or the children's sockets are free to bind, so a path that
    is taken fails the start at once; SocketPathError naming the path otherwise."""
    if len(devices) == 1:
        claim_socket_path(socket_path)
        return
    for index in range(len(devices)):
        claim_socket_path(child_socket_path(socket_path, index))


def run(settings: Settings) -> int:
    socket_path = settings.worker.socket_path
    try:
        devices = resolve_devices(settings.worker.devices)
        claim_own_sockets(socket_path, devices)
    except (DeviceError, SocketPathError) as exc:
        print(f"sie: {exc}", file=sys.stderr)
        return 2
    if len(devices) == 1:
        remove_stale_sockets(child_socket_paths(socket_path).values())  # children of an earlier multi-device run
        return run_main(functools.partial(serve_worker, device=devices[0]), settings)
    remove_stale_sockets([socket_path])  # an earlier single worker's
    return run_main(functools.partial(supervise_workers, devices=devices), settings)
