"""Wiring helpers the role files share: the local worker (manager + service), thread defaults, stream
settings for a transport, preloading, freezing the start-up heap, and waiting for a stop signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, contextmanager
from typing import Any

import attrs

from sie.catalog import Catalog
from sie.settings import Settings
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from sie.worker.manager import ModelManager
from sie.worker.null_backend import NullWorkerService
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

logger = logging.getLogger(__name__)


def default_intra_op_threads() -> int:
    """Every core: measured on 2 cores, onnxruntime with 2 threads beats 1 even next to the event loop
    (scripts/bench/serve.py: 32 clients 613 vs 536 sentences/s), because the loop idles while ORT runs."""
    return os.cpu_count() or 1


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The loop factory SIE_EVENT_LOOP names: uvloop's (`auto` when it is installed) or the standard one."""
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop  # optional: imported only where it is wanted
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("SIE_EVENT_LOOP=uvloop, but uvloop is not installed (pip install uvloop)") from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run_event_loop(main: Coroutine[Any, Any, None], settings: Settings) -> None:
    """Run a role's main coroutine to completion on the event loop SIE_EVENT_LOOP chooses."""
    with asyncio.Runner(loop_factory=event_loop_factory(settings.process.event_loop)) as runner:
        runner.run(main)


async def preload(manager: ModelManager, model_ids: tuple[str, ...]) -> None:
    """Load each model before serving; a failure is logged and leaves the model in its failed state."""
    for model_id in model_ids:
        try:
            await manager.wait_ready(model_id)
            logger.info("preloaded %s", model_id)
        except ModelLoadError as exc:
            logger.error("preloading %s failed (%s): %s", model_id, exc.error_class, exc.message)


def freeze_startup_heap() -> None:
    """Call once start-up is done, right before serving: collect, then move every object alive now
    (modules, catalogue, tokenizers, sessions, the app) into the collector's permanent generation.

    Under load a role promotes request objects into the oldest generation fast enough that a full
    collection runs every few seconds, and each rescans the whole start-up heap: 60-100 ms pauses of the
    event loop, every ~2 s, at 600 requests/s on 2 cores (measured in the gateway and in `all`). Frozen
    objects are never scanned again; what is allocated later is collected as before."""
    gc.collect()
    gc.freeze()
    logger.debug("froze %d start-up objects out of garbage collection", gc.get_freeze_count())


async def wait_for_signal() -> None:
    """Return on the first SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


@attrs.frozen
class LocalWorker:
    """The worker of this process: the service the sidecar calls and the manager behind it."""

    service: WorkerService | NullWorkerService
    manager: ModelManager


@contextmanager
def worker_pools() -> Iterator[tuple[ThreadPoolExecutor, ThreadPoolExecutor]]:
    """One thread that loads models and one that runs them (onnxruntime parallelises inside a run)."""
    with (
        ThreadPoolExecutor(1, thread_name_prefix="sie-load") as load_pool,
        ThreadPoolExecutor(1, thread_name_prefix="sie-infer") as infer_pool,
    ):
        yield load_pool, infer_pool


async def open_local_worker(
    stack: AsyncExitStack, settings: Settings, catalog: Catalog, pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor]
) -> LocalWorker:
    """Build the model manager (entered on `stack`) and the worker service (ONNX or null backend)."""
    worker = settings.worker
    if worker.intra_op_threads is None:
        worker = attrs.evolve(worker, intra_op_threads=default_intra_op_threads())
    load_pool, infer_pool = pools
    loader = ModelLoader.from_settings(worker)
    manager = await stack.enter_async_context(
        ModelManager(catalog, loader.load, load_pool, worker.memory_budget_bytes, worker.max_loaded_models)
    )
    manager.pin(worker.preload_models)
    worker_id = settings.process.worker_id
    if worker.backend == "null":
        return LocalWorker(NullWorkerService(catalog, worker_id, settings.batching.max_batch_items), manager)
    runner = BatchRunner(manager, infer_pool)
    return LocalWorker(WorkerService(manager, runner, worker_id, settings.lane, settings.batching), manager)
