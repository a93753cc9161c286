"""ChildSupervisor over real processes (a tiny Python child): a killed child is restarted, closing stops them all,
and a child that ignores SIGTERM is killed after the grace period."""

from __future__ import annotations

import os
import signal
import sys
import time

from sie.runtime.children import ChildSpec, ChildSupervisor
from support.polling import eventually

SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")
STUBBORN = (
    sys.executable,
    "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(120)",
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead to us: the supervisor has reaped it or is about to.
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_killed_child_is_restarted_and_closing_stops_them_all() -> None:
    children = [ChildSpec("a", SLEEPER, dict(os.environ)), ChildSpec("b", SLEEPER, dict(os.environ))]
    async with ChildSupervisor(children, grace_s=5.0) as supervisor:
        await eventually(lambda: supervisor.pid("a") and supervisor.pid("b"), what="both children to start")
        first_a, first_b = supervisor.pid("a"), supervisor.pid("b")
        os.kill(first_a, signal.SIGKILL)
        started = time.monotonic()
        await eventually(lambda: supervisor.pid("a") not in (None, first_a), what="a restarted")
        assert time.monotonic() - started >= 0.9  # after the first backoff delay, not at once
        assert supervisor.restarts == {"a": 1, "b": 0}
        assert supervisor.pid("b") == first_b
        pids = [supervisor.pid("a"), first_b]
    assert not any(alive(pid) for pid in pids)
    assert supervisor.pid("a") is None and supervisor.pid("b") is None


async def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    async with ChildSupervisor([ChildSpec("stubborn", STUBBORN, dict(os.environ))], grace_s=0.5) as supervisor:
        await eventually(lambda: supervisor.pid("stubborn"), what="the child to start")
        pid = supervisor.pid("stubborn")
        await eventually(lambda: _ignores_sigterm(pid), what="the child to install its handler")
        started = time.monotonic()
    assert 0.4 <= time.monotonic() - started < 5.0
    assert not alive(pid)
    assert supervisor.restarts == {"stubborn": 0}


def _ignores_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        ignored = next(line for line in status if line.startswith("SigIgn:")).split()[1]
    return bool(int(ignored, 16) & (1 << (signal.SIGTERM - 1)))
