"""Admission: per-model pending caps counted from admission to settlement, and the lane-wide room
that bounds each fetch."""

from __future__ import annotations

import asyncio

from sie.sidecar.admission import Admission
from sie.sidecar.work import Work
from sie.wire.queue import WorkItem


class _Delivery:
    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.subject = "sie.work.default.default.default.m"
        self.num_delivered = 1


def works(count: int, model_id: str = "m") -> list[Work]:
    return [
        Work(_Delivery(WorkItem(
            work_item_id=f"{model_id}{i}.0", request_id=f"{model_id}{i}", item_index=0, total_items=1,
            operation="encode", model_id=model_id, profile_id="default", pool_name="default",
            machine_profile="default", router_id="gw", reply_subject="_INBOX.gw.x", timestamp=0.0,
        )), 0.0)
        for i in range(count)
    ]  # fmt: skip


def test_admits_up_to_the_per_model_cap() -> None:
    admission = Admission(max_pending_per_model=3, max_pending_total=10)
    accepted, refused = admission.admit("m", works(5))
    assert len(accepted) == 3 and len(refused) == 2
    assert all(w.admitted for w in accepted) and not any(w.admitted for w in refused)
    assert admission.pending("m") == 3 and admission.free() == 7
    other, _ = admission.admit("n", works(2, "n"))
    assert len(other) == 2 and admission.total == 5


def test_release_frees_slots_once() -> None:
    admission = Admission(3)
    accepted, _ = admission.admit("m", works(3))
    assert admission.free() == 0
    admission.release(accepted[:1])
    admission.release(accepted[:1])  # twice: no double count
    assert admission.pending("m") == 2 and admission.free() == 1
    admission.release(accepted)
    assert admission.total == 0 and admission.pending("m") == 0


def test_held_lists_what_was_admitted_and_not_released() -> None:
    admission = Admission(3)
    accepted, refused = admission.admit("m", works(4))
    assert set(admission.held()) == set(accepted) and refused[0] not in admission.held()
    admission.release(accepted[:2])
    assert admission.held() == accepted[2:]
    admission.release(accepted)
    assert admission.held() == []


async def test_capacity_and_idle_events() -> None:
    admission = Admission(2)
    accepted, _ = admission.admit("m", works(2))
    waiter = asyncio.ensure_future(admission.wait_capacity())
    await asyncio.sleep(0)
    assert not waiter.done()
    assert await admission.wait_idle(0.0) is False
    admission.release(accepted[:1])
    await asyncio.wait_for(waiter, 1.0)
    admission.release(accepted)
    assert await admission.wait_idle(1.0) is True
