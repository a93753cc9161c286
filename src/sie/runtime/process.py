"""Process runtime policy every role shares: which event loop runs it (SIE_EVENT_LOOP), waiting for the stop
signal, freezing the start-up heap out of the garbage collector, and onnxruntime's default thread count.
It builds no component and reads no settings object; the role passes the values it needs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any, Final

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


def run_event_loop(main: Coroutine[Any, Any, None], loop_choice: str) -> None:
    """Run a role's main coroutine to completion on the event loop `loop_choice` (SIE_EVENT_LOOP) names."""
    with asyncio.Runner(loop_factory=event_loop_factory(loop_choice)) as runner:
        runner.run(main)


# Python collects its youngest generation every 700 new container objects by default: a request makes hundreds, so
# under load the collector ran several times a request, scanning the objects of the requests still in flight. At
# 10,000 most of those have been freed by then: in `--role all` under 32 connections (null backend, `perf`), the
# collector's share of the process's CPU went from 4.7 % to 1.6 % (two runs each).
YOUNG_GC_THRESHOLD: Final = 10_000


def freeze_startup_heap() -> None:
    """Call once start-up is done, right before serving: collect, then move every object alive now
    (modules, catalogue, tokenizers, sessions, the app) into the collector's permanent generation.

    Under load a role promotes request objects into the oldest generation fast enough that a full
    collection runs every few seconds, and each rescans the whole start-up heap: 60-100 ms pauses of the
    event loop, every ~2 s, at 600 requests/s on 2 cores (measured in the gateway and in `all`). Frozen
    objects are never scanned again; what is allocated later is collected as before, the youngest generation
    once YOUNG_GC_THRESHOLD objects are waiting in it instead of 700."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
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
