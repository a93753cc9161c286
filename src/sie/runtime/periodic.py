"""Background work done every so often: `PeriodicTask` runs one step every interval on its own task and outlives a
failing step; `Outage` says the first failure of an outage as one warning and its end as one info line. They own
the loop, its timing and its failure log; what a step does, and what it counts, belongs to the step's owner.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Self

logger = logging.getLogger(__name__)

Step = Callable[[], Awaitable[object]]


class Outage:
    """Warn once per outage: the first failure says what failed and why, as a warning (with the traceback unless
    the exception is one of the `expected` kinds) and what happens `meanwhile` ("keeping the last pools");
    failures after it say nothing; the first success after them says, once, at info, that `what` works again and
    how long it did not.

    Log through the owner's `log`, so the lines keep the owner's logger name.
    """

    def __init__(
        self,
        what: str,
        log: logging.Logger = logger,
        expected: tuple[type[BaseException], ...] = (),
        *,
        meanwhile: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self._log = log
        self._expected = expected
        self._meanwhile = meanwhile
        self._clock = clock
        self._since: float | None = None  # when the outage began; None while `what` works

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException, then: str = "retrying") -> None:
        """`what` failed with `exc`; only the first failure of an outage is logged, ending with `then`."""
        if self._since is not None:
            return
        self._since = self._clock()
        reason = str(exc) or type(exc).__name__
        then = f"{self._meanwhile}, {then}" if self._meanwhile else then
        traceback = None if isinstance(exc, self._expected) else exc
        self._log.warning("%s failed (%s); %s", self.what, reason, then, exc_info=traceback)

    def ended(self) -> None:
        """`what` worked: an outage in progress ends with one info line."""
        if self._since is None:
            return
        down_s, self._since = self._clock() - self._since, None
        self._log.info("%s works again after %.1f s of failures", self.what, down_s)


class FirstRun(enum.Enum):
    """When the first step runs."""

    AT_ENTRY = "at_entry"  # `async with` awaits it: the owner is usable with the step's result at once
    AT_START = "at_start"  # at once on the task, without holding up `async with`
    AFTER_INTERVAL = "after_interval"  # one interval after entry (the owner did the first round itself)


class PeriodicTask:
    """`async with` runs `step` every `interval_s` (seconds, or a callable read before each wait) on its own task
    until exit, which cancels and awaits the task.

    A step that raises is reported through `outage` and the next one runs on time. The wait runs from a step's end
    to the next step's start, or from start to start with `fixed_rate` (a step that overran is followed at once).
    `wake()` ends the current wait early; a wake during a step makes the next wait end at once.

    Exit also marks the task closing, and the loop stops at its next turn whatever the step did with the
    cancellation: nats-py swallows a CancelledError delivered inside some of its awaits (`Client._flush_pending`),
    and a step that returned normally after eating it would otherwise go on forever and hold up the role's exit.
    """

    def __init__(
        self,
        step: Step,
        interval_s: float | Callable[[], float],
        outage: Outage,
        *,
        first_run: FirstRun = FirstRun.AFTER_INTERVAL,
        fixed_rate: bool = False,
    ) -> None:
        self._step = step
        self._interval = interval_s if callable(interval_s) else lambda: interval_s
        self.outage = outage
        self._first_run = first_run
        self._fixed_rate = fixed_rate
        self._woken: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def interval_s(self) -> float:
        return self._interval()

    async def __aenter__(self) -> Self:
        self._woken = asyncio.Event()
        self._closing = False
        if self._first_run is FirstRun.AT_ENTRY:
            await self.run_step()
        first = self._first_run is FirstRun.AT_START
        self._task = asyncio.get_running_loop().create_task(self._run(first), name=f"sie-periodic: {self.outage.what}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def wake(self) -> None:
        """Run the next step now rather than at the end of the wait (a no-op outside `async with`)."""
        if self._woken is not None:
            self._woken.set()

    async def run_step(self) -> None:
        """One step, its failure reported through `outage` instead of raised."""
        try:
            await self._step()
        except Exception as exc:  # noqa: BLE001 - a failing step must not end the loop; `outage` reports it
            self.outage.failed(exc, f"retrying every {self.interval_s:g} s")
            return
        self.outage.ended()

    async def _run(self, step_first: bool) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        if step_first:
            await self.run_step()
        while not self._closing:
            wait_s = self.interval_s - (loop.time() - started if self._fixed_rate else 0.0)
            await self._wait(wait_s)
            if self._closing:
                return
            started = loop.time()
            await self.run_step()

    async def _wait(self, wait_s: float) -> None:
        """Sleep `wait_s` (at least one loop step), or less when woken."""
        woken = self._woken
        if woken is None or woken.is_set() or wait_s <= 0:
            if woken is not None:
                woken.clear()
            await asyncio.sleep(0)
            return
        try:
            async with asyncio.timeout(wait_s):
                await woken.wait()
        except TimeoutError:
            return
        woken.clear()
