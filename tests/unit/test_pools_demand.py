"""Pending demand per lane (seed 000 §16.3): recorded by requests that found no worker, cleared only by work
published to that exact lane, expired `ttl_s` after the last record, and bounded in lanes."""

from __future__ import annotations

import pytest

from sie.pools import DemandTracker, LaneKey

TTL_S = 300.0
L4: LaneKey = ("default", "l4", "default")
A100: LaneKey = ("default", "a100", "default")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_records_count_per_lane_and_a_publish_clears_only_its_lane(clock: Clock) -> None:
    tracker = DemandTracker(TTL_S, clock=clock)
    assert tracker.snapshot() == {}
    for _ in range(3):
        tracker.record(L4)
    tracker.record(A100)
    assert tracker.snapshot() == {L4: 3, A100: 1}
    tracker.clear(L4)
    tracker.clear(("other", "l4", "default"))  # a lane without demand: nothing to clear
    assert tracker.snapshot() == {A100: 1}


def test_demand_expires_ttl_after_its_last_record(clock: Clock) -> None:
    tracker = DemandTracker(TTL_S, clock=clock)
    tracker.record(L4)
    clock.now += 200
    tracker.record(L4)  # refreshes the deadline in place
    clock.now += 200
    assert tracker.snapshot() == {L4: 2}
    clock.now += 100
    assert tracker.snapshot() == {}
    tracker.record(L4)
    assert tracker.snapshot() == {L4: 1}  # an expired lane starts counting afresh


def test_no_more_than_max_lanes_are_held(clock: Clock) -> None:
    tracker = DemandTracker(TTL_S, max_lanes=2, clock=clock)
    assert tracker.record(L4) and tracker.record(A100)
    assert not tracker.record(("default", "h100", "default"))
    assert tracker.record(L4)  # a lane already held is still counted
    assert tracker.snapshot() == {L4: 2, A100: 1}
    clock.now += 150
    tracker.record(L4)
    clock.now += 150  # A100's demand has expired, L4's has not
    assert tracker.record(("default", "h100", "default"))
    assert tracker.snapshot() == {L4: 3, ("default", "h100", "default"): 1}


@pytest.mark.parametrize(("ttl_s", "max_lanes"), [(0.0, 10), (-1.0, 10), (1.0, 0)])
def test_nonsense_bounds_are_refused(ttl_s: float, max_lanes: int) -> None:
    with pytest.raises(ValueError, match="DemandTracker needs"):
        DemandTracker(ttl_s, max_lanes=max_lanes)
