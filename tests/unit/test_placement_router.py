"""Placement's routing and state machine: round_robin, least_outstanding by work basis, lpt_packing's
replicas, fill modes, routing policies, compute-driven repacks, failover and the snapshot (seed 002)."""

from __future__ import annotations

import logging

import pytest

from sie.placement.policy import PlacementPolicy, PolicyError
from sie.placement.reports import ChildReport, ModelReport
from sie.placement.router import Placement

W = ("worker-0", "worker-1", "worker-2")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def model(model_id: str, cost: float | None = 0.01, max_batch: int = 4, batched: bool = True, memory: int = 0):
    return ModelReport(model_id, True, memory, cost, max_batch, batched)


def fleet(
    models: list[ModelReport],
    names: tuple[str, ...] = W,
    compute: float = 0.0,
    unready: tuple[str, ...] = (),
) -> list[ChildReport]:
    by_id = {report.model_id: report for report in models}
    return [ChildReport(name, f"cuda:{i}", name not in unready, compute, None, by_id) for i, name in enumerate(names)]


def placement(models: list[ModelReport], names: tuple[str, ...] = W, **knobs: object) -> Placement:
    router = Placement(PlacementPolicy(**knobs), clock=Clock(), wall_clock=lambda: 1_700_000_000.0)
    router.update(fleet(models, names))
    return router


def route(router: Placement, model_id: str, count: int, items: int = 1, finish: bool = False) -> list[str]:
    """Choose and start `count` batches over every child; finish each at once when `finish`."""
    picks = []
    for _ in range(count):
        child = router.choose(model_id, items, list(W))
        assert child is not None
        ticket = router.started(child, model_id, items)
        if finish:
            router.finished(ticket, 0.01)
        picks.append(child)
    return picks


# --- round_robin and least_outstanding -------------------------------------------------------------------


def test_round_robin_rotates_per_model() -> None:
    router = placement([model("a"), model("b")])
    assert [router.choose("a", 1, W) for _ in range(4)] == ["worker-0", "worker-1", "worker-2", "worker-0"]
    assert router.choose("b", 1, W) == "worker-0"
    assert router.choose("a", 1, W) == "worker-1"


def test_no_candidate_means_no_child() -> None:
    assert placement([model("a")]).choose("a", 1, []) is None


def test_failover_chooses_among_the_remaining_candidates() -> None:
    router = placement([model("a")])
    assert router.choose("a", 1, W) == "worker-0"
    assert router.choose("a", 1, ["worker-0", "worker-2"]) == "worker-2"


def test_every_ready_child_is_assigned_outside_lpt_packing() -> None:
    router = Placement(PlacementPolicy())
    router.update(fleet([model("a")], unready=("worker-1",)))
    assert router.assigned("a") == ("worker-0", "worker-2")
    assert router.repack() is None


def _cheap_and_expensive(work_basis: str) -> Placement:
    router = placement(
        [model("cheap", cost=0.001, max_batch=32), model("dear", cost=0.1)],
        names=W[:2],
        mode="least_outstanding",
        work_basis=work_basis,
    )
    router.started("worker-0", "cheap", 32)  # 0.032 compute-seconds, 32 items, 1 batch
    router.started("worker-0", "cheap", 1)  # a second batch: worker-0 holds 2 batches
    router.started("worker-1", "dear", 4)  # 0.4 compute-seconds, 4 items, 1 batch
    return router


@pytest.mark.parametrize(
    ("work_basis", "expected"), [("compute", "worker-0"), ("items", "worker-1"), ("requests", "worker-1")]
)
def test_least_outstanding_weighs_by_the_work_basis(work_basis: str, expected: str) -> None:
    assert _cheap_and_expensive(work_basis).choose("cheap", 1, W[:2]) == expected


def test_a_cold_model_weighs_the_fleet_mean_cost() -> None:
    router = placement(
        [model("cheap", cost=0.001, max_batch=64), model("dear", cost=0.1), model("cold", cost=None)],
        names=W[:2],
        mode="least_outstanding",
    )
    router.started("worker-0", "cold", 1)  # charged the mean of 0.001 and 0.1: 0.0505
    router.started("worker-1", "cheap", 40)  # 0.04
    assert router.choose("cheap", 1, W[:2]) == "worker-1"
    assert router.snapshot().children[0].inflight_work == pytest.approx(0.0505)


def test_a_model_without_a_batch_axis_counts_one_unit_per_batch() -> None:
    router = placement([model("meta", max_batch=8, batched=False), model("single", max_batch=1)], mode="lpt_packing")
    router.started("worker-0", "meta", 8)
    router.started("worker-0", "single", 5)
    state = router.snapshot().children[0]
    assert state.inflight_items == 2
    assert state.inflight_work == pytest.approx(0.02)


def test_exact_ties_rotate_instead_of_pinning_the_lowest_name() -> None:
    router = placement([model("a")], mode="least_outstanding")
    assert [router.choose("a", 1, W) for _ in range(4)] == ["worker-0", "worker-1", "worker-2", "worker-0"]


# --- lpt_packing placement ---------------------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "count"), [(1, 1), (2, 2), (5, 3), ("all", 3)])
def test_lpt_places_each_model_on_its_replica_count(replicas: int | str, count: int) -> None:
    router = placement([model("a")], mode="lpt_packing", default_replicas=replicas)
    assert len(router.assigned("a")) == count


def test_a_model_asked_for_before_any_report_is_placed_at_once() -> None:
    router = placement([model("a")], mode="lpt_packing")
    assert router.assigned("new") != ()
    assert "new" in [entry.model_id for entry in router.snapshot().models]


def test_all_replicas_follow_the_ready_children() -> None:
    router = placement([model("a")], mode="lpt_packing", default_replicas="all")
    router.update(fleet([model("a")], unready=("worker-1",)))
    assert router.assigned("a") == ("worker-0", "worker-2")
    router.update(fleet([model("a")]))
    assert router.assigned("a") == W


def test_a_model_whose_only_child_drops_out_is_placed_again() -> None:
    router = placement([model("a")], mode="lpt_packing")
    (first,) = router.assigned("a")
    router.update(fleet([model("a")], unready=(first,)))
    (second,) = router.assigned("a")
    assert second != first


def test_replicas_fail_over_to_the_remaining_candidates() -> None:
    router = placement([model("a")], mode="lpt_packing", default_replicas=2)
    hosts = router.assigned("a")
    assert router.choose("a", 1, [hosts[1]]) == hosts[1]


def test_when_no_replica_is_a_candidate_the_batch_goes_to_a_candidate_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = placement([model("a")], mode="lpt_packing")
    (host,) = router.assigned("a")
    others = [name for name in W if name != host]
    with caplog.at_level(logging.WARNING, logger="sie.placement.router"):
        assert router.choose("a", 1, others) in others
        assert router.choose("a", 1, others) in others
        assert len(caplog.records) == 1
        assert router.choose("a", 1, W) == host  # converged: warn again next time it degrades
        router.choose("a", 1, others)
    assert len(caplog.records) == 2


def test_set_model_takes_effect_at_the_next_repack() -> None:
    router = placement([model("a")], mode="lpt_packing")
    override = router.set_model("a", replicas=2)
    assert override.replicas == 2
    assert len(router.assigned("a")) == 1
    router.repack()
    assert len(router.assigned("a")) == 2


def test_repack_puts_the_two_heaviest_models_apart() -> None:
    router = placement([model(name) for name in ("a", "b", "c", "d")], names=W[:2], mode="lpt_packing")
    for name, compute in (("a", 1.0), ("b", 0.1), ("c", 0.1), ("d", 0.9)):
        ticket = router.started(router.assigned(name)[0], name, 1)
        router.finished(ticket, compute)
    router.repack()
    assert router.assigned("a") != router.assigned("d")


def test_a_repack_evens_out_what_heaviest_first_leaves_uneven() -> None:
    # Measured 3, 3, 2, 2, 2: heaviest first alone puts 7 against 5 on two children; the packer's refinement
    # swaps a 3 for a 2.
    router = placement([model(name) for name in "abcde"], names=W[:2], mode="lpt_packing")
    demand = {"a": 3.0, "b": 3.0, "c": 2.0, "d": 2.0, "e": 2.0}
    for name, compute in demand.items():
        ticket = router.started(router.assigned(name)[0], name, 1)
        router.finished(ticket, compute)
    router.repack()
    per_child = {child: 0.0 for child in W[:2]}
    for name, compute in demand.items():
        (child,) = router.assigned(name)
        per_child[child] += compute
    assert per_child == {"worker-0": 6.0, "worker-1": 6.0}


# --- repack triggers -----------------------------------------------------------------------------------


def _budgeted(clock: Clock) -> Placement:
    policy = PlacementPolicy(mode="lpt_packing", first_rebalance_compute_seconds=10, rebalance_compute_seconds=100)
    router = Placement(policy, clock=clock, wall_clock=lambda: 0.0)
    router.update(fleet([model("a")], compute=0.0))
    return router


def _repacks(router: Placement) -> int:
    return sum(count for _, count in router.snapshot().repacks_total)


def test_repacks_follow_consumed_compute_not_wall_time() -> None:
    clock = Clock()
    router = _budgeted(clock)
    clock.now += 10_000
    for _ in range(3):
        router.update(fleet([model("a")], compute=0.0))  # an idle fleet never repacks
    assert _repacks(router) == 0
    router.update(fleet([model("a")], compute=3.0))  # 9 device-seconds over three children
    assert _repacks(router) == 0
    router.update(fleet([model("a")], compute=4.0))  # 12 >= the first budget of 10
    assert router.snapshot().repacks_total == (("compute", 1),)
    record = router.snapshot().last_repack
    assert record is not None
    assert record.compute_seconds == pytest.approx(12.0)
    assert record.wall_seconds == pytest.approx(10_000)
    router.update(fleet([model("a")], compute=30.0))  # 78 more: under the steady budget of 100
    assert _repacks(router) == 1
    router.update(fleet([model("a")], compute=38.0))  # 102
    assert _repacks(router) == 2


def test_a_child_restart_counts_its_new_total() -> None:
    router = _budgeted(Clock())
    router.update(fleet([model("a")], names=W[:1], compute=8.0))
    router.update(fleet([model("a")], names=W[:1], compute=2.0))  # restarted: 2 more, not -6
    record = router.snapshot().last_repack
    assert record is not None
    assert record.compute_seconds == pytest.approx(10.0)


def test_repack_logs_one_line_naming_what_moved(caplog: pytest.LogCaptureFixture) -> None:
    router = placement([model("a"), model("b")], names=W[:2], mode="lpt_packing")
    assert router.assigned("a") != router.assigned("b")
    router.set_model("b", replicas=2)
    with caplog.at_level(logging.INFO, logger="sie.placement.router"):
        record = router.repack()
    assert record is not None
    assert record.trigger == "manual"
    assert record.models_placed == 2
    assert record.moved == ("b worker-1→worker-0,worker-1",)
    (line,) = [entry.getMessage() for entry in caplog.records if "repack" in entry.getMessage()]
    assert line.startswith("lpt_packing: repack (manual) placed 2 models, moved 1 (b worker-1→worker-0,worker-1)")


# --- lpt_packing fill modes and routing policies --------------------------------------------------------


def test_run_mode_keeps_a_replica_for_a_quantum_of_items() -> None:
    router = placement([model("a", max_batch=4)], mode="lpt_packing", default_replicas=2)
    assert route(router, "a", 8) == ["worker-0"] * 4 + ["worker-1"] * 4


def test_the_quantum_counts_items_not_batches() -> None:
    router = placement([model("a", max_batch=4)], mode="lpt_packing", default_replicas=2)
    assert route(router, "a", 3, items=2) == ["worker-0", "worker-0", "worker-1"]


def test_the_fill_factor_scales_the_quantum() -> None:
    router = placement([model("a", max_batch=4)], mode="lpt_packing", default_replicas=2)
    router.set_model("a", fill_factor=0.5)
    assert route(router, "a", 4) == ["worker-0", "worker-0", "worker-1", "worker-1"]


def test_a_run_ends_when_the_model_has_nothing_in_flight() -> None:
    router = placement([model("a", max_batch=4)], mode="lpt_packing", default_replicas=2)
    assert route(router, "a", 4, finish=True) == ["worker-0", "worker-1", "worker-0", "worker-1"]


def _backed_up_worker_0() -> Placement:
    router = placement([model("a", max_batch=4)], names=W[:2], mode="lpt_packing", default_replicas="all")
    router.set_policy({"routing_policy": "fill_rr"})
    route(router, "a", 4)  # run 1 on worker-0, still in flight
    assert route(router, "a", 4, finish=True) == ["worker-1"] * 4  # run 2 on worker-1, done
    return router


def test_a_replica_a_whole_quantum_behind_loses_its_turn() -> None:
    router = _backed_up_worker_0()
    # Run 3 opens on worker-0 in turn; holding 5 items against worker-1's 0, it yields after one batch.
    assert route(router, "a", 2) == ["worker-0", "worker-1"]


def test_spread_evens_in_flight_items_over_the_replicas() -> None:
    router = placement([model("a", max_batch=4)], mode="lpt_packing", default_replicas="all")
    router.set_model("a", fill_mode="spread")
    router.started("worker-1", "a", 3)
    assert route(router, "a", 5) == ["worker-0", "worker-2", "worker-0", "worker-2", "worker-0"]


def test_inflight_mode_keeps_a_replica_until_it_holds_a_quantum_of_batches() -> None:
    router = placement([model("a", max_batch=2)], names=W[:2], mode="lpt_packing", default_replicas="all")
    router.set_policy({"routing_fill_mode": "inflight"})
    assert route(router, "a", 3, items=2) == ["worker-0", "worker-0", "worker-1"]
    router2 = placement([model("a", max_batch=2)], names=W[:2], mode="lpt_packing", default_replicas="all")
    router2.set_policy({"routing_fill_mode": "inflight"})
    assert route(router2, "a", 3, finish=True) == ["worker-0"] * 3  # parks: nothing in flight never ends it


def _with_other_load(routing_policy: str) -> Placement:
    router = placement([model("a"), model("other")], names=W[:2], mode="lpt_packing", default_replicas="all")
    router.set_policy({"routing_policy": routing_policy})
    router.started("worker-0", "other", 4)
    return router


def test_fill_least_opens_runs_on_the_least_busy_child() -> None:
    assert _with_other_load("fill_least").choose("a", 1, W[:2]) == "worker-1"


def test_fill_rr_opens_runs_in_turn_whatever_the_load() -> None:
    router = _with_other_load("fill_rr")
    assert route(router, "a", 5, finish=True)[:4] == ["worker-0", "worker-1", "worker-0", "worker-1"]


def test_fill_least_ties_rotate() -> None:
    router = placement([model("a")], mode="lpt_packing", default_replicas="all")
    assert route(router, "a", 4, finish=True) == ["worker-0", "worker-1", "worker-2", "worker-0"]


# --- control, accounting and the snapshot ----------------------------------------------------------------


def test_set_policy_validates_and_applies() -> None:
    router = placement([model("a")], mode="lpt_packing")
    assert router.set_policy({"hysteresis": "0.15"}).hysteresis == pytest.approx(0.15)
    assert router.policy.hysteresis == pytest.approx(0.15)
    with pytest.raises(PolicyError, match="mode is fixed"):
        router.set_policy({"mode": "round_robin"})
    with pytest.raises(PolicyError):
        router.set_policy({"routing_fill_factor": "-2"})
    assert router.policy.routing_fill_factor == 1.0


def test_a_ticket_finished_twice_is_a_bug() -> None:
    router = placement([model("a")])
    ticket = router.started("worker-0", "a", 1)
    router.finished(ticket)
    with pytest.raises(RuntimeError, match="this is a bug"):
        router.finished(ticket)


def test_demand_ages_by_fleet_compute() -> None:
    router = placement([model("a"), model("b")], mode="lpt_packing", ema_halflife_compute_seconds=10)
    router.finished(router.started("worker-0", "a", 1), 10.0)
    router.update(fleet([model("a"), model("b")], compute=10 / 3))  # one halflife: a's 10 becomes 5
    router.finished(router.started("worker-1", "b", 1), 5.0)
    demand = {entry.model_id: entry.demand for entry in router.snapshot().models}
    assert demand == pytest.approx({"a": 0.5, "b": 0.5})


def test_the_snapshot_shows_children_models_repacks_and_batch_sizes() -> None:
    router = placement([model("a", max_batch=32)], mode="lpt_packing", default_replicas=2)
    hosts = router.assigned("a")
    for items in (1, 3, 32):
        router.finished(router.started(hosts[0], "a", items), 0.05)
    router.started(hosts[1], "a", 5)
    router.started(hosts[1], "unreported", 2)
    router.repack()
    snapshot = router.snapshot()

    assert snapshot.policy == router.policy
    busy = next(child for child in snapshot.children if child.name == hosts[1])
    assert (busy.inflight_batches, busy.inflight_items, busy.loaded_models) == (2, 7, ("a",))
    assert [entry.model_id for entry in snapshot.models] == ["a", "unreported"]
    a = snapshot.models[0]
    assert (a.replicas_setting, a.fill_mode, a.fill_quantum, a.demand) == (2, "run", 32, 1.0)
    assert [(r.child, r.weight, r.outstanding_items) for r in a.replicas] == [(hosts[0], 0.5, 0), (hosts[1], 0.5, 5)]
    assert (a.replicas[0].routed_batches, a.replicas[0].routed_items) == (3, 36)
    assert snapshot.repacks_total == (("manual", 1),)
    assert snapshot.last_repack is not None and snapshot.last_repack.at == 1_700_000_000.0
    (sizes,) = snapshot.batch_sizes
    assert (sizes.child, sizes.model_id, sizes.count, sizes.total_items) == (hosts[0], "a", 3, 36)
    assert dict(sizes.buckets)[1.0] == 1
    assert dict(sizes.buckets)[4.0] == 2
    assert dict(sizes.buckets)[16.0] == 2
    assert dict(sizes.buckets)[32.0] == 3
    assert dict(sizes.buckets)[float("inf")] == 3
