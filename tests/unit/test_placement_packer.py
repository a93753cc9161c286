"""LPT packing: heaviest first onto the least pressured child, distinct replicas, memory fit (forbidden
oversubscription when feasible, a fallback when not), hysteresis, the incremental single placement, the
refinement after the greedy pass (moves and swaps that lower the children's pressures), and the pressure
model that follows fill_least routing (a fluid replicated model water-filled over its replicas)."""

from __future__ import annotations

import random

import pytest

from sie.placement.packer import ChildCapacity, ModelDemand, pack, place_one, replica_loads, water_fill

GB = 1 << 30


def children(*names: str, budget: int | None = None) -> list[ChildCapacity]:
    return [ChildCapacity(name, budget) for name in names]


def demand(model_id: str, compute: float, memory: int = 0, replicas: int = 1, fluid: bool = True) -> ModelDemand:
    return ModelDemand(model_id, compute, memory, replicas, fluid)


def loads(placement: dict[str, tuple[str, ...]], models: list[ModelDemand]) -> dict[str, float]:
    """Each child's compute as the packer counts it (fluid replicated models water-filled)."""
    totals: dict[str, float] = {}
    for shares in replica_loads(models, placement).values():
        for host, load in shares.items():
            totals[host] = totals.get(host, 0.0) + load
    return totals


def test_heaviest_first_balances_where_name_order_would_not() -> None:
    # Names sort opposite to weight: packing in name order would give loads 7/9/11, heaviest first 9/9/9.
    models = [demand("a", 2), demand("b", 3), demand("c", 4), demand("d", 5), demand("e", 6), demand("f", 7)]
    result = pack(models, children("w0", "w1", "w2"), previous={})
    assert sorted(loads(dict(result.placement), models).values()) == [9.0, 9.0, 9.0]
    assert len({result.placement["f"], result.placement["e"], result.placement["d"]}) == 3


def test_replicas_land_on_distinct_children_and_are_capped() -> None:
    models = [demand("hot", 10, replicas=3), demand("wide", 1, replicas=5)]
    result = pack(models, children("w0", "w1", "w2"), previous={})
    assert result.placement["hot"] == ("w0", "w1", "w2")
    assert result.placement["wide"] == ("w0", "w1", "w2")


def test_a_replicated_model_spreads_its_compute_over_its_replicas() -> None:
    # Load-blind routing (fill_rr) splits "hot" evenly: 4 and 4, and the best is 4, 4, 8.
    models = [demand("hot", 8, replicas=2, fluid=False), demand("x", 4), demand("y", 4)]
    result = pack(models, children("w0", "w1", "w2"), previous={})
    assert sorted(loads(dict(result.placement), models).values()) == [4.0, 4.0, 8.0]
    assert len(result.placement["hot"]) == 2


def test_a_fluid_replicated_model_flows_to_its_less_loaded_replica() -> None:
    # fill_least routing: "y" beside "hot" on w0 pushes hot's traffic to w1 (2 and 6), children at 6, 6, 4.
    models = [demand("hot", 8, replicas=2), demand("x", 4), demand("y", 4)]
    result = pack(models, children("w0", "w1", "w2"), previous={})
    assert sorted(loads(dict(result.placement), models).values()) == [4.0, 6.0, 6.0]
    assert len(result.placement["hot"]) == 2


def test_memory_pressure_counts_as_much_as_compute() -> None:
    # w0 has the least compute, but its memory is nearly full: its pressure is the memory's.
    def where(big_memory: int) -> tuple[str, ...]:
        others = {"big": demand("big", 0.5, big_memory), "other": demand("other", 0.6), "heavy": demand("heavy", 3)}
        placed = {"big": ("w0",), "other": ("w1",), "heavy": ("w2",)}
        new = demand("new", 0.2, memory=GB // 2)
        fleet = children("w0", "w1", "w2", budget=10 * GB)
        return place_one(new, fleet, placed, others, forbid_oversubscription=False)

    assert where(big_memory=0) == ("w0",)
    assert where(big_memory=9 * GB) == ("w1",)


def _crowded(forbid: bool) -> dict[str, tuple[str, ...]]:
    # w1 carries most of the compute; w0 has room for compute but only 2 GB of memory left.
    models = [
        demand("busy", 10, memory=1 * GB),
        demand("resident", 1, memory=8 * GB),
        demand("new", 1, memory=4 * GB),
    ]
    previous = {"busy": ("w1",), "resident": ("w0",)}
    return dict(pack(models, children("w0", "w1", budget=10 * GB), previous, 0.0, forbid).placement)


def test_forbidden_oversubscription_never_strands_a_model_when_some_child_holds_it() -> None:
    assert _crowded(forbid=True)["new"] == ("w1",)
    assert _crowded(forbid=False)["new"] == ("w0",)  # the pressure rule alone would oversubscribe w0


def test_weights_that_fit_nowhere_are_placed_anyway_and_reported() -> None:
    models = [demand("huge", 1, memory=20 * GB), demand("small", 1, memory=1 * GB)]
    result = pack(models, children("w0", "w1", budget=10 * GB), previous={}, forbid_oversubscription=True)
    assert len(result.placement["huge"]) == 1
    assert result.oversubscribed == ("huge",)


def _skewed(hysteresis: float):
    # "m" sat on w0 with "heavy"; moving it to w1 improves its pressure from 2.0 to 0.5.
    models = [demand("heavy", 3), demand("m", 1)]
    return pack(models, children("w0", "w1"), {"heavy": ("w0",), "m": ("w0",)}, hysteresis=hysteresis)


def test_hysteresis_holds_a_single_replica_model_unless_the_gain_is_larger() -> None:
    moved = _skewed(hysteresis=0.0)
    assert moved.placement["m"] == ("w1",)
    assert moved.moved == ("m w0→w1",)
    assert moved.held_by_hysteresis == ()
    assert moved.max_improvement == 1.5
    held = _skewed(hysteresis=2.0)
    assert held.placement["m"] == ("w0",)
    assert held.moved == ()
    # "heavy" too: the refinement would have moved it to w1 (the pair's larger pressure 2.0 → 1.5).
    assert held.held_by_hysteresis == ("heavy", "m")


def test_an_equal_choice_keeps_the_previous_child() -> None:
    models = [demand("a", 1), demand("b", 1)]
    result = pack(models, children("w0", "w1"), {"a": ("w1",), "b": ("w0",)})
    assert result.placement == {"a": ("w1",), "b": ("w0",)}
    assert result.moved == ()


def test_hysteresis_never_keeps_a_model_where_its_weights_no_longer_fit() -> None:
    models = [demand("resident", 1, memory=8 * GB), demand("m", 1, memory=4 * GB)]
    previous = {"resident": ("w0",), "m": ("w0",)}
    result = pack(models, children("w0", "w1", budget=10 * GB), previous, hysteresis=100.0)
    assert result.placement["m"] == ("w1",)


def test_packing_is_deterministic() -> None:
    models = [demand(f"m{i}", float(i % 3 + 1), memory=i * GB, replicas=1 + i % 2) for i in range(9)]
    fleet = children("w0", "w1", "w2", "w3", budget=16 * GB)
    assert pack(models, fleet, {}) == pack(list(reversed(models)), list(reversed(fleet)), {})


def test_one_model_is_placed_on_the_least_pressured_child_next_to_the_others() -> None:
    others = {"a": demand("a", 5), "b": demand("b", 1)}
    placed = {"a": ("w0",), "b": ("w1",)}
    assert place_one(demand("new", 1), children("w0", "w1"), placed, others) == ("w1",)
    assert place_one(demand("new", 1, replicas=2), children("w0", "w1"), placed, others) == ("w0", "w1")


# --- the refinement after the greedy pass ----------------------------------------------------------------


def spread(placement: dict[str, tuple[str, ...]], models: list[ModelDemand]) -> float:
    """(max − min) / mean of the children's compute."""
    values = list(loads(placement, models).values())
    return (max(values) - min(values)) / (sum(values) / len(values))


def memory_used(placement: dict[str, tuple[str, ...]], models: list[ModelDemand]) -> dict[str, int]:
    by_id = {model.model_id: model for model in models}
    used: dict[str, int] = {}
    for model_id, hosts in placement.items():
        for host in hosts:
            used[host] = used.get(host, 0) + by_id[model_id].memory_bytes
    return used


# Demand shares of 8 models where heaviest-first leaves 0.22..0.28 against a fair 0.25.
SKEWED_SHARES = {"a": 0.24, "b": 0.19, "c": 0.13, "d": 0.12, "e": 0.10, "f": 0.08, "g": 0.07, "h": 0.07}


def test_the_refinement_evens_out_what_greedy_lpt_leaves_uneven() -> None:
    models = [demand(model_id, share) for model_id, share in SKEWED_SHARES.items()]
    fleet = children("w0", "w1", "w2", "w3")
    greedy = pack(models, fleet, previous={}, refine_steps=0)
    refined = pack(models, fleet, previous={})
    assert spread(dict(greedy.placement), models) > 0.20
    assert spread(dict(refined.placement), models) <= 0.10
    assert greedy.refine_steps == 0
    assert refined.refine_steps > 0


def test_a_swap_fixes_the_textbook_lpt_case() -> None:
    # Heaviest first puts 3+2+2 and 3+2 on two children (7 against 5); swapping a 3 for a 2 gives 6 and 6.
    models = [demand("a", 3), demand("b", 3), demand("c", 2), demand("d", 2), demand("e", 2)]
    greedy = pack(models, children("w0", "w1"), previous={}, refine_steps=0)
    refined = pack(models, children("w0", "w1"), previous={})
    assert sorted(loads(dict(greedy.placement), models).values()) == [5.0, 7.0]
    assert sorted(loads(dict(refined.placement), models).values()) == [6.0, 6.0]
    assert refined.refine_steps == 1


def test_the_refinement_never_puts_weights_where_they_do_not_fit() -> None:
    # The only even split is {a, b} / {c, d, e}, but c, d and e need 11 GB on a 10 GB child.
    models = [
        demand("a", 3, memory=1 * GB),
        demand("b", 3, memory=1 * GB),
        demand("c", 2, memory=1 * GB),
        demand("d", 2, memory=5 * GB),
        demand("e", 2, memory=5 * GB),
    ]
    unbounded = pack(models, children("w0", "w1"), previous={})
    assert spread(dict(unbounded.placement), models) == 0.0
    bounded = pack(models, children("w0", "w1", budget=10 * GB), previous={})
    assert max(memory_used(dict(bounded.placement), models).values()) <= 10 * GB
    assert bounded.oversubscribed == ()
    assert spread(dict(bounded.placement), models) > 0.0


def test_hysteresis_holds_a_model_the_refinement_would_move() -> None:
    # Last time's placement is what greedy LPT gives again (7 against 5); the swap gains 7/6 − 1 = 1/6.
    models = [demand("a", 3), demand("b", 3), demand("c", 2), demand("d", 2), demand("e", 2)]
    fleet = children("w0", "w1")
    previous = dict(pack(models, fleet, previous={}, refine_steps=0).placement)
    held = pack(models, fleet, previous, hysteresis=0.2)
    assert held.placement == previous
    assert held.moved == ()
    assert held.refine_steps == 0
    assert held.held_by_hysteresis == ("a", "d")  # the 3 on w0 and the 2 on w1 the swap would exchange
    assert held.max_improvement == pytest.approx(1 / 6)
    moved = pack(models, fleet, previous, hysteresis=0.1)
    assert sorted(loads(dict(moved.placement), models).values()) == [6.0, 6.0]
    assert moved.moved == ("a w0→w1", "d w1→w0")
    assert moved.held_by_hysteresis == ()


def test_a_step_back_to_the_previous_child_needs_no_hysteresis() -> None:
    # "c" was on w1 before; greedy puts it on w0, and the swap that balances brings it back.
    models = [demand("a", 3), demand("b", 3), demand("c", 2), demand("d", 2), demand("e", 2)]
    greedy = dict(pack(models, children("w0", "w1"), previous={}, refine_steps=0).placement)
    refined = dict(pack(models, children("w0", "w1"), previous={}).placement)
    previous = {model_id: refined[model_id] for model_id in refined if refined[model_id] != greedy[model_id]}
    result = pack(models, children("w0", "w1"), previous, hysteresis=100.0)
    assert sorted(loads(dict(result.placement), models).values()) == [6.0, 6.0]
    assert result.moved == ()


def test_the_refinement_is_deterministic() -> None:
    models = [demand(model_id, share, memory=GB) for model_id, share in SKEWED_SHARES.items()]
    fleet = children("w0", "w1", "w2", "w3", budget=8 * GB)
    shuffled_models, shuffled_fleet = list(models), list(fleet)
    random.Random(7).shuffle(shuffled_models)
    random.Random(8).shuffle(shuffled_fleet)
    first = pack(models, fleet, {})
    assert first.refine_steps > 0
    assert pack(shuffled_models, shuffled_fleet, {}) == first
    assert pack(models, fleet, {}) == first


def test_the_refinement_takes_at_most_its_steps() -> None:
    # Greedy LPT gives 7, 7, 5, 5; each swap of a 3 for a 2 evens one pair.
    models = [demand(f"big{i}", 3) for i in range(4)] + [demand(f"small{i}", 2) for i in range(6)]
    fleet = children("w0", "w1", "w2", "w3")
    full = pack(models, fleet, {})
    assert full.refine_steps == 2
    assert sorted(loads(dict(full.placement), models).values()) == [6.0] * 4
    one = pack(models, fleet, {}, refine_steps=1)
    assert one.refine_steps == 1
    assert sorted(loads(dict(one.placement), models).values()) == [5.0, 6.0, 6.0, 7.0]


@pytest.mark.parametrize("seed", range(20))
def test_the_refinement_never_raises_the_highest_pressure_or_breaks_a_fit(seed: int) -> None:
    rng = random.Random(seed)
    models = [
        demand(f"m{i}", rng.uniform(0.1, 5.0), memory=rng.choice((1, 2, 3)) * GB, replicas=rng.choice((1, 1, 1, 2)))
        for i in range(rng.randint(4, 14))
    ]
    budget = 12 * GB
    fleet = children("w0", "w1", "w2", "w3", budget=budget)
    greedy = pack(models, fleet, {}, refine_steps=0)
    refined = pack(models, fleet, {})

    def highest(placement: dict[str, tuple[str, ...]]) -> float:  # water-filled, as the packer counts
        fair = sum(model.compute for model in models) / len(fleet)
        used = memory_used(placement, models)
        return max(max(load / fair, used.get(child, 0) / budget) for child, load in loads(placement, models).items())

    assert highest(dict(refined.placement)) <= highest(dict(greedy.placement)) + 1e-9
    for model in models:  # replicated models stay where the greedy pass put them
        if model.replicas > 1:
            assert refined.placement[model.model_id] == greedy.placement[model.model_id]
    greedy_used, refined_used = (
        memory_used(dict(greedy.placement), models),
        memory_used(dict(refined.placement), models),
    )
    for child in refined_used:
        assert refined_used[child] <= budget or refined_used[child] <= greedy_used.get(child, 0)


# --- water-filling: the pressure model of fill_least routing ---------------------------------------------


def test_water_filling_evens_the_children_when_the_demand_suffices() -> None:
    child_loads, splits = water_fill({"w0": 5.0, "w1": 1.0, "w2": 0.0}, {"m": (7.0, ("w0", "w1"))})
    assert child_loads == pytest.approx({"w0": 6.5, "w1": 6.5, "w2": 0.0})
    assert splits == {"m": pytest.approx({"w0": 1.5, "w1": 5.5})}


def test_a_model_with_little_demand_lifts_a_low_child_only_partway() -> None:
    child_loads, splits = water_fill({"w0": 5.0, "w1": 1.0}, {"m": (1.0, ("w0", "w1"))})
    assert child_loads == pytest.approx({"w0": 5.0, "w1": 2.0})
    assert splits == {"m": pytest.approx({"w0": 0.0, "w1": 1.0})}


def test_overlapping_fluid_models_settle_to_even_loads() -> None:
    # m1 on w0, w1 and m2 on w1, w2 chain through w1: everything evens out at 2 (to rounding).
    base = {"w0": 0.0, "w1": 0.0, "w2": 0.0}
    child_loads, splits = water_fill(base, {"m1": (3.0, ("w0", "w1")), "m2": (3.0, ("w1", "w2"))})
    assert child_loads == pytest.approx({"w0": 2.0, "w1": 2.0, "w2": 2.0})
    assert sum(splits["m1"].values()) == pytest.approx(3.0)
    assert sum(splits["m2"].values()) == pytest.approx(3.0)


def test_water_filling_is_deterministic() -> None:
    base = {"w0": 2.0, "w1": 1.0, "w2": 0.5, "w3": 0.0}
    fluid = {"m1": (2.0, ("w0", "w1", "w2")), "m2": (1.5, ("w2", "w3")), "m3": (0.25, ("w1", "w3"))}
    first = water_fill(base, fluid)
    again = water_fill(
        dict(reversed(base.items())), {k: (d, tuple(reversed(c))) for k, (d, c) in reversed(fluid.items())}
    )
    assert again == first
    assert sum(first[0].values()) == pytest.approx(sum(base.values()) + 3.75)


def test_a_model_on_one_child_or_with_load_blind_routing_is_split_evenly() -> None:
    models = [demand("blind", 4, replicas=2, fluid=False), demand("pinned", 3), demand("one", 2, replicas=1)]
    shares = replica_loads(models, {"blind": ("w0", "w1"), "pinned": ("w0",), "one": ("w1",)})
    assert shares == {"blind": {"w0": 2.0, "w1": 2.0}, "pinned": {"w0": 3.0}, "one": {"w1": 2.0}}


# A hot model on 2 replicas beside three single-replica models: split evenly (4, 4) nothing evens the
# children out (the best is 9, 5, 7, 7); water-filled (fill_least) it tops up the child beside the 4 to 7.
FLUID_CASE = {"hot": (10.0, 2), "x": (7.0, 1), "y": (7.0, 1), "z": (4.0, 1)}


def spread_of(child_loads: dict[str, float]) -> float:
    values = list(child_loads.values())
    return (max(values) - min(values)) / (sum(values) / len(values))


def test_water_filled_packing_reaches_an_even_spread_where_even_split_packing_cannot() -> None:
    fleet = children("w0", "w1", "w2", "w3")
    even = [demand(model_id, compute, replicas=count, fluid=False) for model_id, (compute, count) in FLUID_CASE.items()]
    fluid = [demand(model_id, compute, replicas=count) for model_id, (compute, count) in FLUID_CASE.items()]
    even_result = pack(even, fleet, previous={})
    fluid_result = pack(fluid, fleet, previous={})
    assert spread_of(loads(dict(even_result.placement), even)) > 0.10
    assert spread_of(loads(dict(fluid_result.placement), fluid)) <= 0.10
    assert sorted(loads(dict(fluid_result.placement), fluid).values()) == pytest.approx([7.0] * 4)
    assert set(fluid_result.placement["z"]) <= set(fluid_result.placement["hot"])


def test_the_refinement_steps_count_the_fluid_model_water_filled() -> None:
    # Fair 7. Greedy: hot on w0, w1; b 7 on w2; d 5 on w3; a 4 on w0 (hot levels w0 and w1 at 6.5); c 3 on
    # w3 (8). Swapping a and d gives w3 7 and lets hot lift w0 and w1 to 7: the step touches w1 as well.
    fleet = children("w0", "w1", "w2", "w3")
    models = [demand("hot", 9.0, replicas=2), demand("a", 4.0), demand("b", 7.0), demand("c", 3.0), demand("d", 5.0)]
    greedy = pack(models, fleet, previous={}, refine_steps=0)
    refined = pack(models, fleet, previous={})
    assert sorted(loads(dict(greedy.placement), models).values()) == pytest.approx([6.5, 6.5, 7.0, 8.0])
    assert sorted(loads(dict(refined.placement), models).values()) == pytest.approx([7.0] * 4)
    assert refined.refine_steps == 1
    assert refined.placement["hot"] == greedy.placement["hot"]


def test_a_fluid_model_never_lets_a_step_put_weights_where_they_do_not_fit() -> None:
    # z (4 GB) would even the loads beside hot, but hot's children hold 8 GB of a 10 GB budget each.
    fleet = children("w0", "w1", "w2", "w3", budget=10 * GB)
    models = [
        demand("hot", 10.0, memory=8 * GB, replicas=2),
        demand("x", 7.0, memory=1 * GB),
        demand("y", 7.0, memory=1 * GB),
        demand("z", 4.0, memory=4 * GB),
    ]
    result = pack(models, fleet, previous={})
    assert max(memory_used(dict(result.placement), models).values()) <= 10 * GB
    assert result.oversubscribed == ()
    assert not set(result.placement["z"]) & set(result.placement["hot"])


def test_hysteresis_holds_a_model_a_water_filled_step_would_move() -> None:
    # Last time z sat beside x (loads 5, 5, 7, 11 against a fair 7); beside hot all four reach 7, a gain of
    # 11/7 - 1 = 4/7 for the highest child z leaves.
    fleet = children("w0", "w1", "w2", "w3")
    models = [demand(model_id, compute, replicas=count) for model_id, (compute, count) in FLUID_CASE.items()]
    previous = {"hot": ("w0", "w1"), "x": ("w2",), "y": ("w3",), "z": ("w3",)}
    held = pack(models, fleet, previous, hysteresis=1.0)
    assert held.placement == previous
    assert "z" in held.held_by_hysteresis
    assert held.max_improvement == pytest.approx(4 / 7)
    moved = pack(models, fleet, previous, hysteresis=0.5)
    assert moved.placement["z"] in (("w0",), ("w1",))
    assert sorted(loads(dict(moved.placement), models).values()) == pytest.approx([7.0] * 4)
