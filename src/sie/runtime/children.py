"""Supervising child processes: start each one, restart one that dies (backing off while it keeps dying), and
stop them all with a grace period. Generic: it knows commands and environments, not what the children run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, Self

logger = logging.getLogger(__name__)

FIRST_RESTART_DELAY_S: Final = 1.0
MAX_RESTART_DELAY_S: Final = 30.0
# A child that ran this long before dying was healthy: its next restart waits the first delay again.
HEALTHY_RUN_S: Final = 60.0


def restart_delay(previous_s: float | None, ran_s: float) -> float:
    """The wait before restarting a child that died after running `ran_s` seconds: 1 s, doubling on each
    death up to 30 s, and 1 s again after a run of at least 60 s. `previous_s` is the last wait (None: first)."""
    if previous_s is None or ran_s >= HEALTHY_RUN_S:
        return FIRST_RESTART_DELAY_S
    return min(MAX_RESTART_DELAY_S, previous_s * 2)


def describe_exit(returncode: int) -> str:
    """`exit status 3` or `killed by SIGKILL`, as an operator reads a child's end in the log."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One child to keep running: a stable name for the logs, its command line and its whole environment."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


class ChildSupervisor:
    """Keeps every child of `children` running until it is closed; an async context manager.

    On exit every child gets SIGTERM and `grace_s` seconds to end before SIGKILL. `restarts` counts restarts by
    child name; `pid(name)` is the running process id (None between a death and its restart).
    """

    def __init__(self, children: Sequence[ChildSpec], grace_s: float) -> None:
        self.children = tuple(children)
        self.grace_s = grace_s
        self.restarts: dict[str, int] = {child.name: 0 for child in self.children}
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: asyncio.Event | None = None

    async def __aenter__(self) -> Self:
        self._stopping = stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._keep(child, stopping), name=f"keep-{child.name}") for child in self.children
        ]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def pid(self, name: str) -> int | None:
        process = self._processes.get(name)
        return process.pid if process is not None and process.returncode is None else None

    async def stop(self) -> None:
        """SIGTERM every child, wait up to `grace_s` for them all to end, then SIGKILL the rest."""
        if self._stopping is None or self._stopping.is_set() or not self._tasks:
            return
        self._stopping.set()
        for process in list(self._processes.values()):
            _send(process, signal.SIGTERM)
        _, running = await asyncio.wait(self._tasks, timeout=self.grace_s)  # does not cancel what is left
        if running:
            for name, process in self._processes.items():
                if process.returncode is None:
                    logger.warning("child %s (pid %d) still running after %g s; killing it", name, process.pid,
                                   self.grace_s)  # fmt: skip
                    _send(process, signal.SIGKILL)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _keep(self, child: ChildSpec, stopping: asyncio.Event) -> None:
        """Run `child` until the supervisor stops, restarting it after each death."""
        loop = asyncio.get_running_loop()
        delay: float | None = None
        while not stopping.is_set():
            started = loop.time()
            ended = await self._run_once(child, stopping)
            if stopping.is_set():
                return
            ran_s = loop.time() - started
            delay = restart_delay(delay, ran_s)
            self.restarts[child.name] += 1
            logger.warning("child %s ended after %.1f s (%s); restarting it in %g s", child.name, ran_s, ended, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)

    async def _run_once(self, child: ChildSpec, stopping: asyncio.Event) -> str:
        """Start `child` and wait for it to end; how it ended, for the log."""
        try:
            process = await asyncio.create_subprocess_exec(*child.command, env=dict(child.env),
                                                           stdin=subprocess.DEVNULL)  # fmt: skip
        except OSError as exc:
            logger.error("cannot start child %s: %s", child.name, exc)
            return f"not started: {exc}"
        self._processes[child.name] = process
        logger.info("started child %s (pid %d)", child.name, process.pid)
        if stopping.is_set():  # stop() ran while this child was being spawned
            _send(process, signal.SIGTERM)
        ended = f"pid {process.pid}, {describe_exit(await process.wait())}"
        if stopping.is_set():
            logger.info("child %s ended (%s)", child.name, ended)
        return ended


def _send(process: asyncio.subprocess.Process, signum: signal.Signals) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
