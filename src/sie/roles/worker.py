"""`sie run --role worker`: the model backend behind the IPC server on SIE_IPC_SOCKET_PATH; it never
touches NATS. The sidecar in the same pod dials the socket.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

from sie.ipc.server import IpcServer
from sie.roles.common import baseline_catalog, open_local_worker, run_main, worker_pools
from sie.runtime import freeze_startup_heap, wait_for_signal
from sie.settings import Settings

logger = logging.getLogger(__name__)


async def serve_worker(settings: Settings) -> None:
    catalog = baseline_catalog(settings)
    worker_id, socket_path = settings.process.worker_id, settings.worker.socket_path
    with worker_pools() as pools:
        async with AsyncExitStack() as stack:
            local = await open_local_worker(stack, settings, catalog, pools)
            freeze_startup_heap()
            await stack.enter_async_context(IpcServer(local.service, socket_path, worker_id=worker_id))
            logger.info("worker %s serving IPC on %s", worker_id, socket_path)
            await wait_for_signal()
            logger.info("worker %s shutting down", worker_id)


def run(settings: Settings) -> int:
    return run_main(serve_worker, settings)
