"""Wiring helpers the role files share: thread defaults, stream settings for a transport, preloading,
and waiting for a stop signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from sie.settings import Settings
from sie.transport import base
from sie.worker.errors import ModelLoadError
from sie.worker.manager import ModelManager

logger = logging.getLogger(__name__)


def default_intra_op_threads() -> int:
    """Every core: measured on 2 cores, onnxruntime with 2 threads beats 1 even next to the event loop
    (scripts/bench/serve.py: 32 clients 613 vs 536 sentences/s), because the loop idles while ORT runs."""
    return os.cpu_count() or 1


def stream_settings(settings: Settings) -> base.StreamSettings:
    """The transport's view of SIE_STREAM_* / SIE_MAX_DELIVER / SIE_ACK_WAIT_S."""
    stream = settings.stream
    return base.StreamSettings(
        max_msgs=stream.max_msgs,
        max_age_s=stream.max_age_s,
        ack_wait_s=stream.ack_wait_s,
        max_deliver=stream.max_deliver,
        storage=stream.storage,
        replicas=stream.replicas,
    )


async def preload(manager: ModelManager, model_ids: tuple[str, ...]) -> None:
    """Load each model before serving; a failure is logged and leaves the model in its failed state."""
    for model_id in model_ids:
        try:
            await manager.wait_ready(model_id)
            logger.info("preloaded %s", model_id)
        except ModelLoadError as exc:
            logger.error("preloading %s failed (%s): %s", model_id, exc.error_class, exc.message)


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
