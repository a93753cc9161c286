"""Compaction's bookkeeping: a compaction starts every `compaction_interval` repacks, names a (child, model) pair
only once the model's replicas all serve it, waits for in-flight batches (`eager`: the model's on that child;
`scheduled`: any on that child), leaves a declined pair for the next compaction, and ends when nothing is left."""

from __future__ import annotations

import pytest

from sie.placement.compaction import Compaction
from sie.placement.policy import PlacementPolicy
from sie.placement.reports import ChildReport, ModelReport


def child(name: str, *loaded: str, ready: bool = True) -> ChildReport:
    return ChildReport(name, "cpu", ready, models={model: ModelReport(model, loaded=True) for model in loaded})


def idle(child: str, model: str | None) -> bool:
    return False


POLICY = PlacementPolicy(mode="lpt_packing")
# "m" moved from worker-0 to worker-1; worker-0 still holds it, and "n" which stays there.
CHILDREN = [child("worker-0", "m", "n"), child("worker-1", "m")]
PLACEMENT = {"m": ("worker-1",), "n": ("worker-0",)}


def started(policy: PlacementPolicy = POLICY) -> Compaction:
    compaction = Compaction()
    compaction.after_repack(policy)
    return compaction


def test_nothing_is_due_before_a_repack_starts_a_compaction() -> None:
    assert Compaction().due(POLICY, CHILDREN, PLACEMENT, idle) == []


def test_the_pair_a_repack_left_behind_is_due_and_the_compaction_ends_once_it_is_gone() -> None:
    compaction = started()
    assert compaction.due(POLICY, CHILDREN, PLACEMENT, idle) == [("worker-0", "m")]
    compaction.unloaded("worker-0", "m", 4096)
    after = [child("worker-0", "n"), child("worker-1", "m")]
    assert compaction.due(POLICY, after, PLACEMENT, idle) == []
    state = compaction.state()
    assert (state.pending, state.compactions_total, state.unloads_total, state.freed_bytes_total) == (False, 1, 1, 4096)


def test_a_model_waits_until_every_replica_serves_it() -> None:
    compaction = started()
    loading = [child("worker-0", "m", "n"), child("worker-1")]
    assert compaction.due(POLICY, loading, PLACEMENT, idle) == []
    assert compaction.state().pending  # still waiting for worker-1
    not_ready = [child("worker-0", "m", "n"), child("worker-1", "m", ready=False)]
    assert compaction.due(POLICY, not_ready, PLACEMENT, idle) == []
    assert compaction.due(POLICY, CHILDREN, PLACEMENT, idle) == [("worker-0", "m")]


@pytest.mark.parametrize(
    ("mode", "busy_with", "due"),
    [
        ("eager", "n", [("worker-0", "m")]),  # another model's batch does not hold eager back
        ("eager", "m", []),
        ("scheduled", "n", []),  # scheduled waits for the child to be quiet
        ("scheduled", None, [("worker-0", "m")]),
    ],
)
def test_in_flight_batches_hold_the_unload_back(mode: str, busy_with: str | None, due: list) -> None:
    policy = PlacementPolicy(mode="lpt_packing", compaction_mode=mode)

    def busy(name: str, model: str | None) -> bool:
        return busy_with is not None and name == "worker-0" and model in (busy_with, None)

    assert started(policy).due(policy, CHILDREN, PLACEMENT, busy) == due


def test_every_nth_repack_compacts_and_off_or_zero_never_does() -> None:
    policy = PlacementPolicy(mode="lpt_packing", compaction_interval=3)
    compaction = Compaction()
    for _ in range(2):
        compaction.after_repack(policy)
    assert not compaction.state().pending
    compaction.after_repack(policy)
    assert compaction.state().pending and compaction.state().compactions_total == 1
    for off in (PlacementPolicy(compaction_mode="off"), PlacementPolicy(compaction_interval=0)):
        assert started(off).due(off, CHILDREN, PLACEMENT, idle) == []
        assert started(off).state().compactions_total == 0


def test_turning_compaction_off_ends_a_pending_one() -> None:
    compaction = started()
    off = PlacementPolicy(mode="lpt_packing", compaction_mode="off")
    assert compaction.due(off, CHILDREN, PLACEMENT, idle) == []
    assert not compaction.state().pending


def test_a_declined_pair_is_left_for_the_next_compaction() -> None:
    compaction = started()
    compaction.unloaded("worker-0", "m", None)  # the child kept it (preloaded there)
    assert compaction.due(POLICY, CHILDREN, PLACEMENT, idle) == []
    assert not compaction.state().pending and compaction.state().unloads_total == 0
    compaction.after_repack(POLICY)
    assert compaction.due(POLICY, CHILDREN, PLACEMENT, idle) == [("worker-0", "m")]


def test_models_never_placed_and_children_not_ready_are_left_alone() -> None:
    compaction = started()
    children = [child("worker-0", "preloaded-only"), child("worker-1", "m", ready=False), child("worker-2", "m")]
    assert compaction.due(POLICY, children, {"m": ("worker-2",)}, idle) == []
