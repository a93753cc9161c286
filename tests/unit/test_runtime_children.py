"""The child supervisor's pure parts: the restart backoff and how a child's end reads in the log."""

from __future__ import annotations

import signal

from sie.runtime.children import (
    FIRST_RESTART_DELAY_S,
    HEALTHY_RUN_S,
    MAX_RESTART_DELAY_S,
    describe_exit,
    restart_delay,
)


def test_the_backoff_doubles_from_one_second_to_thirty() -> None:
    delays, delay = [], None
    for _ in range(8):
        delay = restart_delay(delay, ran_s=0.5)
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert (FIRST_RESTART_DELAY_S, MAX_RESTART_DELAY_S) == (1.0, 30.0)


def test_a_child_that_ran_a_minute_restarts_after_the_first_delay_again() -> None:
    assert restart_delay(16.0, ran_s=HEALTHY_RUN_S) == FIRST_RESTART_DELAY_S
    assert restart_delay(16.0, ran_s=HEALTHY_RUN_S - 1) == 30.0


def test_exits_read_as_a_status_or_a_signal() -> None:
    assert describe_exit(0) == "exit status 0"
    assert describe_exit(3) == "exit status 3"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"
