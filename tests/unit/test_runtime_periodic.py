"""PeriodicTask and Outage: when the first step runs, the cadence, surviving a failing step, warning once per
outage and saying its end once, waking early, and the task ending with `async with`."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from support.polling import eventually

LOGGER = logging.getLogger("test.periodic")
LONG_S = 60.0  # an interval no test waits for


class Steps:
    """A step that counts its calls and fails while `failures` says so."""

    def __init__(self, failures: int = 0, error: Exception | None = None) -> None:
        self.calls = 0
        self.failures = failures
        self.error = error or ConnectionError("broker away")

    async def __call__(self) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise self.error


def periodic(step: Steps, interval_s: float = LONG_S, **options: object) -> PeriodicTask:
    return PeriodicTask(step, interval_s, Outage("refreshing the things", LOGGER, (ConnectionError,)), **options)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_first_step_runs_one_interval_after_entry_by_default() -> None:
    step = Steps()
    async with periodic(step):
        await settle()
        assert step.calls == 0
    async with periodic(step, 0.01):
        await eventually(lambda: step.calls >= 3)


async def test_at_entry_the_first_step_is_done_when_async_with_returns() -> None:
    step = Steps()
    async with periodic(step, first_run=FirstRun.AT_ENTRY):
        assert step.calls == 1
        await settle()
        assert step.calls == 1  # the next one waits its interval


async def test_at_start_the_first_step_runs_on_the_task_without_holding_up_entry() -> None:
    gate = asyncio.Event()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        await gate.wait()

    async with PeriodicTask(step, LONG_S, Outage("waiting", LOGGER), first_run=FirstRun.AT_START):
        await eventually(lambda: calls == 1)
        gate.set()
        await settle()
        assert calls == 1


async def test_exit_cancels_the_task_and_no_step_runs_after_it() -> None:
    step = Steps()
    task = periodic(step, 0.001)
    async with task:
        await eventually(lambda: step.calls >= 2)
    calls = step.calls
    await asyncio.sleep(0.02)
    assert step.calls == calls and task._task is None


async def test_exit_ends_the_loop_even_when_a_step_swallows_the_cancellation() -> None:
    """nats-py's `Client._flush_pending` eats a CancelledError delivered while it waits: the step then returns as if
    nothing happened, and the loop must still end rather than run its next step (a gateway stopped during a pool
    refresh hung there until killed)."""
    entered = asyncio.Event()
    calls = 0
    swallowed = False

    async def swallowing_step() -> None:
        nonlocal calls, swallowed
        calls += 1
        entered.set()
        try:
            await asyncio.sleep(LONG_S)
        except asyncio.CancelledError:
            if swallowed:  # only the first: a test that fails still ends
                raise
            swallowed = True

    task = PeriodicTask(swallowing_step, 0.001, Outage("refreshing the things", LOGGER))
    await task.__aenter__()
    await entered.wait()
    exiting = asyncio.ensure_future(task.__aexit__(None, None, None))
    done, _ = await asyncio.wait([exiting], timeout=5.0)
    if not done:
        exiting.cancel()
    assert done and swallowed, "exit waited on a loop that went on after its step ate the cancellation"
    assert calls == 1


async def test_a_failing_step_warns_once_per_outage_and_says_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER.name)
    step = Steps(failures=3)
    async with periodic(step, 0.001):
        await eventually(lambda: step.calls >= 5)
    lines = [(record.levelno, record.getMessage()) for record in caplog.records if record.name == LOGGER.name]
    assert lines[0] == (logging.WARNING, "refreshing the things failed (broker away); retrying every 0.001 s")
    assert lines[1][0] == logging.INFO and lines[1][1].startswith("refreshing the things works again after ")
    assert len(lines) == 2
    assert caplog.records[0].exc_info is None  # an expected kind of failure: its reason, no traceback


async def test_an_unexpected_failure_carries_its_traceback_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    step = Steps(failures=1, error=RuntimeError("a bug"))
    async with periodic(step, 0.001):
        await eventually(lambda: step.calls >= 3)
    warning = next(record for record in caplog.records if record.levelno == logging.WARNING)
    assert warning.exc_info is not None and warning.exc_info[1] is step.error


def test_a_second_outage_warns_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER.name)
    clock = [0.0]
    outage = Outage("polling", LOGGER, meanwhile="keeping the last view", clock=lambda: clock[0])
    outage.failed(TimeoutError())
    clock[0] = 2.5
    outage.failed(OSError("again"))
    outage.ended()
    outage.ended()
    outage.failed(OSError("later"), "retrying in a minute")
    assert [record.getMessage() for record in caplog.records] == [
        "polling failed (TimeoutError); keeping the last view, retrying",
        "polling works again after 2.5 s of failures",
        "polling failed (later); keeping the last view, retrying in a minute",
    ]
    assert outage.ongoing


async def test_wake_runs_the_next_step_at_once() -> None:
    step = Steps()
    async with periodic(step, first_run=FirstRun.AT_ENTRY) as task:
        task.wake()
        await eventually(lambda: step.calls == 2)
        task.wake()
        await eventually(lambda: step.calls == 3)


async def test_a_wake_during_a_step_ends_the_next_wait_at_once() -> None:
    calls = 0
    task: PeriodicTask | None = None

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1 and task is not None:
            task.wake()

    task = PeriodicTask(step, LONG_S, Outage("beating", LOGGER), first_run=FirstRun.AT_START)
    async with task:
        await eventually(lambda: calls == 2)


async def test_the_interval_is_read_before_each_wait() -> None:
    step = Steps()
    interval = [LONG_S]
    async with PeriodicTask(step, lambda: interval[0], Outage("polling", LOGGER), first_run=FirstRun.AT_START) as task:
        await eventually(lambda: step.calls == 1)
        assert task.interval_s == LONG_S
        interval[0] = 0.001
        task.wake()  # the wait in progress was for the long interval
        await eventually(lambda: step.calls >= 4)


@pytest.mark.parametrize("fixed_rate", [False, True])
async def test_at_a_fixed_rate_the_step_time_counts_against_the_interval(
    fixed_rate: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    async def slow_step() -> None:
        await asyncio.sleep(0.05)

    async def record(wait_s: float) -> None:
        waits.append(wait_s)
        await asyncio.sleep(0)

    task = PeriodicTask(slow_step, 1.0, Outage("beating", LOGGER), first_run=FirstRun.AT_START, fixed_rate=fixed_rate)
    monkeypatch.setattr(task, "_wait", record)
    async with task:
        await eventually(lambda: len(waits) >= 2)
    if fixed_rate:
        assert all(wait <= 0.95 for wait in waits[:2])  # start to start: the 50 ms step is part of the second
    else:
        assert waits[:2] == [1.0, 1.0]  # end to start
