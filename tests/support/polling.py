"""Waiting on a condition against a deadline: with the launcher's `holds_within`, the one place the tests sleep.

A test that needs something to happen polls for it here, never with a fixed sleep or a loop of its own:
`eventually` in async tests (the condition may be sync or async), `holds_within` (from `launcher`, re-exported
here) for synchronous code that drives subprocesses without an event loop (it returns False at the deadline, so
the caller raises its own error with the logs it holds).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from launcher import holds_within

__all__ = ["eventually", "holds_within"]

WAIT_S = 5.0
INTERVAL_S = 0.005


async def eventually(
    condition: Callable[[], object | Awaitable[object]],
    *,
    timeout_s: float = WAIT_S,
    interval_s: float = INTERVAL_S,
    what: str = "the condition",
) -> None:
    """Return once `condition()` is truthy, awaiting its result when that is awaitable; check again every
    `interval_s` (0: every event-loop step), and raise AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await _holds(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def _holds(condition: Callable[[], object | Awaitable[object]]) -> bool:
    outcome = condition()
    return bool(await outcome if inspect.isawaitable(outcome) else outcome)
