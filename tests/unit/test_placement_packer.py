"""LPT packing: heaviest first onto the least pressured child, distinct replicas, memory fit (forbidden
oversubscription when feasible, a fallback when not), hysteresis, and the incremental single placement."""

from __future__ import annotations

from sie.placement.packer import ChildCapacity, ModelDemand, pack, place_one

GB = 1 << 30


def children(*names: str, budget: int | None = None) -> list[ChildCapacity]:
    return [ChildCapacity(name, budget) for name in names]


def demand(model_id: str, compute: float, memory: int = 0, replicas: int = 1) -> ModelDemand:
    return ModelDemand(model_id, compute, memory, replicas)


def loads(placement: dict[str, tuple[str, ...]], models: list[ModelDemand]) -> dict[str, float]:
    by_id = {model.model_id: model for model in models}
    totals: dict[str, float] = {}
    for model_id, hosts in placement.items():
        for host in hosts:
            totals[host] = totals.get(host, 0.0) + by_id[model_id].compute / len(hosts)
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
    models = [demand("hot", 8, replicas=2), demand("x", 4), demand("y", 4)]
    result = pack(models, children("w0", "w1", "w2"), previous={})
    assert sorted(loads(dict(result.placement), models).values()) == [4.0, 4.0, 8.0]
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
    assert held.held_by_hysteresis == ("m",)


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
