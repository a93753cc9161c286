"""Abandoned work: deadlines (absolute unix time) and work_cancel tombstones, bounded by a cap and a horizon."""

from __future__ import annotations

from types import SimpleNamespace

from sie.sidecar.abandonment import Abandonment, Tombstones, cancel_key, tombstone_horizon


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def work(request_id: str, deadline: float | None = None, router_id: str = "gw") -> SimpleNamespace:
    item = SimpleNamespace(router_id=router_id, request_id=request_id, deadline=deadline)
    return SimpleNamespace(item=item, operation="encode")


def test_cancel_subjects_name_a_router_and_a_request() -> None:
    assert cancel_key("work_cancel.gw-1.gw-1-42") == ("gw-1", "gw-1-42")
    for subject in ("work_cancel.gw-1", "work_cancel..r", "sie.work.a.b", "work_cancel.a.b.c"):
        assert cancel_key(subject) is None


def test_tombstones_expire_after_the_horizon_and_the_oldest_go_first_over_the_cap() -> None:
    clock = Clock()
    tombstones = Tombstones(horizon_s=10.0, cap=2, clock=clock)
    tombstones.add("gw", "r1")
    assert ("gw", "r1") in tombstones and ("other", "r1") not in tombstones
    clock.now += 11.0
    assert ("gw", "r1") not in tombstones
    tombstones.add("gw", "r2")
    tombstones.add("gw", "r3")
    tombstones.add("gw", "r4")
    assert len(tombstones) == 2 and ("gw", "r2") not in tombstones and ("gw", "r4") in tombstones


def test_the_horizon_covers_the_redelivery_window() -> None:
    assert tombstone_horizon(max_age_s=60.0, ack_wait_s=30.0, max_deliver=5) == 150.0
    assert tombstone_horizon(max_age_s=3600.0, ack_wait_s=30.0, max_deliver=5) == 3600.0


async def test_split_drops_expired_and_cancelled_work_and_counts_why() -> None:
    wall = Clock(5000.0)
    abandonment = Abandonment(Tombstones(horizon_s=60.0), wall_clock=wall)
    await abandonment.on_cancel("work_cancel.gw.cancelled", {})
    await abandonment.on_cancel("not.a.cancel", {})
    works = [work("fine", deadline=5001.0), work("late", deadline=5000.0), work("cancelled"), work("no-deadline")]
    live, abandoned = abandonment.split(works)
    assert [w.item.request_id for w in live] == ["fine", "no-deadline"]
    assert [w.item.request_id for w in abandoned] == ["late", "cancelled"]
    assert abandonment.dropped == {"expired": 1, "cancelled": 1}
