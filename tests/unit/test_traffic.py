"""The status page's traffic ring (gateway/traffic.py): per-second buckets, the partial second left out, old
seconds forgotten when the ring comes round, and the rate over the newest seconds."""

from __future__ import annotations

import pytest

from sie.gateway.traffic import TrafficWindow, is_inference_path


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_requests_land_in_their_second_and_the_current_second_is_left_out() -> None:
    clock = Clock(1000.2)
    window = TrafficWindow(seconds=5, clock=clock)
    window.record(0.010, failed=False)
    window.record(0.030, failed=True)
    assert window.series().requests == [0, 0, 0, 0, 0]  # second 1000 is not over yet
    clock.now = 1001.0
    series = window.series()
    assert series.requests == [0, 0, 0, 0, 2] and series.failed == [0, 0, 0, 0, 1]
    assert series.latency_mean_ms[-1] == pytest.approx(20.0) and series.latency_max_ms[-1] == pytest.approx(30.0)
    clock.now = 1003.5
    assert window.series().requests == [0, 0, 2, 0, 0]


def test_a_slot_reused_by_a_later_second_forgets_the_old_one() -> None:
    clock = Clock(1000.0)
    window = TrafficWindow(seconds=3, clock=clock)
    for _ in range(4):
        window.record(0.5, failed=True)
    clock.now = 1003.0  # same slot as 1000
    window.record(0.001, failed=False)
    clock.now = 1004.0
    series = window.series()
    assert series.requests == [0, 0, 1] and series.failed == [0, 0, 0]
    assert series.latency_max_ms == [0.0, 0.0, 1.0]


def test_seconds_older_than_the_window_are_not_shown() -> None:
    clock = Clock(1000.0)
    window = TrafficWindow(seconds=4, clock=clock)
    window.record(0.1, failed=False)
    clock.now = 1010.0
    assert window.series().requests == [0, 0, 0, 0]


def test_requests_per_second_is_the_mean_of_the_newest_seconds() -> None:
    clock = Clock(100.0)
    window = TrafficWindow(seconds=30, clock=clock)
    for second, count in ((100, 10), (105, 5), (109, 5)):
        clock.now = second + 0.5
        for _ in range(count):
            window.record(0.001, failed=False)
    clock.now = 110.0
    series = window.series()
    assert series.requests_per_s(10) == pytest.approx(2.0)
    assert series.requests_per_s(5) == pytest.approx(2.0)
    assert series.to_dict()["requests_per_s"] == pytest.approx(2.0)


def test_a_window_holds_at_least_one_second() -> None:
    with pytest.raises(ValueError, match="at least one second"):
        TrafficWindow(seconds=0)


@pytest.mark.parametrize(
    ("path", "counted"),
    [
        ("/v1/encode/BAAI/bge-m3", True),
        ("/v1/score/m", True),
        ("/v1/extract/m", True),
        ("/v1/embeddings", True),
        ("/v1/models", False),
        ("/health", False),
        ("/", False),
        ("/v1/encodex", False),
    ],
)
def test_only_inference_routes_are_traffic(path: str, counted: bool) -> None:
    assert is_inference_path(path) is counted
