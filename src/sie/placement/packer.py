"""LPT packing (seed 002 "lpt_packing"): place each model's replicas on distinct children, heaviest first,
each where the children's pressures stay lowest, where a child's pressure is whichever of compute load
(against a fair share) or resident weights (against the child's budget) is closer to full. Pure functions
of their arguments.

The pressure model follows the routing. Under fill_least (seed 002 "The fill quantum") each run of a
replicated model opens on whichever of its replicas carries the least in-flight work, so its traffic is
fluid: it flows toward the less loaded of its children and absorbs the imbalance the models pinned to one
child leave. The packer therefore counts a `fluid` replicated model's compute water-filled over its
replicas: given everything else's load, its demand goes to its least loaded children first, raising them to
a common level as far as its demand allows (a model with little demand lifts a low child only partway; one
with enough evens its children out). Several fluid models are water-filled in turn until no split changes
(`water_fill`; deterministic, bounded sweeps). A model that is not fluid (fill_rr rotates runs load-blind,
the `spread` fill mode evens the model's own items) is split evenly over its replicas, as is every model
on a single child trivially.

Greedy pass: models heaviest first, one replica at a time (a replicated model carries its per-replica
share for each replica placed so far) onto the child that leaves the children's pressures lowest: sorted
from the highest down and compared in that order, so first the highest pressure, then the next. Ties: a
child it was on before, then the lower pressure before adding, then the name.

Refinement (our addition on top of the seed's LPT): heaviest-first greedy placement can leave children
uneven when a few models carry most of the demand (8 models with shares 0.24, 0.19, 0.13, 0.12, 0.10, 0.08,
0.07, 0.07 on 4 children: greedy gives 0.22..0.28 against a fair 0.25, where 0.24..0.26 exists). After the
greedy pass `pack` therefore runs a bounded local improvement over the single-replica models: moving one
model to another child, or swapping two models on different children. A step is taken only when it lowers
the children's pressures in the order above (water-filled, so a step can relieve a child by moving a model
next to it and letting a replicated model's traffic flow over), so the fleet's highest pressure never rises
and each step makes the sorted pressures strictly smaller (it terminates; `refine_steps`, 64 by default,
only bounds the work). The step taken is the one that leaves the pressures lowest, ties by model and child
names, so the result is deterministic. A step never adds weights to a child where they do not fit,
whatever `forbid_oversubscription` says, and a step that takes a model off the child it had before the
repack must gain more than the hysteresis, as the greedy pass requires of a move (such a model is reported
held by hysteresis); a step's gain is how much it lowers the highest pressure among the children whose
pressure it changes. Replicated models and models placed where their weights do not fit stay where the
greedy pass put them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

# Steps of the local improvement after the greedy pass (each strictly improves; this only bounds the work).
DEFAULT_REFINE_STEPS = 64
# Pressure differences below this are rounding, not improvement.
_EPSILON = 1e-9
# Water-filling sweeps over the fluid models (a single fluid model, or several on the same children, settle
# in one; chains of overlapping replica sets converge geometrically, and this only bounds the work).
_WATER_FILL_SWEEPS = 200


@attrs.frozen
class ModelDemand:
    """One model to place: its compute demand (any unit shared by all models), resident weight bytes (0 when
    unknown) and how many distinct children it goes on (already capped by the number of children).

    `fluid`: its routing sends each run to the least loaded of its replicas (fill_least), so its compute is
    water-filled over its replicas; False splits it evenly (fill_rr, the `spread` fill mode)."""

    model_id: str
    compute: float
    memory_bytes: int
    replicas: int
    fluid: bool = True


@attrs.frozen
class ChildCapacity:
    """One child that can host models; `memory_budget_bytes` None means no budget (no memory pressure)."""

    name: str
    memory_budget_bytes: int | None = None


@attrs.frozen
class PackResult:
    """Where each model goes (children in name order), and what the packing did about the old placement.

    `moved` names each model whose children changed (`model a→b`); `held_by_hysteresis` lists single-replica
    models kept on their old child because the move gained no more than the hysteresis (in the greedy pass
    or a refinement step that would have taken it off); `oversubscribed`
    lists models placed where their weights do not fit because no child could hold them; `max_improvement`
    is the largest pressure gain any single-replica model could have had by moving (in the greedy pass or a
    refinement step that would take it off its previous child); `refine_steps` counts the refinement steps
    taken.
    """

    placement: Mapping[str, tuple[str, ...]]
    moved: tuple[str, ...] = ()
    held_by_hysteresis: tuple[str, ...] = ()
    oversubscribed: tuple[str, ...] = ()
    max_improvement: float = 0.0
    refine_steps: int = 0


# --- water-filling ---------------------------------------------------------------------------------------


def _fill_one(demand: float, levels: Mapping[str, float]) -> dict[str, float]:
    """`demand` over the children of `levels` (their loads without it), lowest first up to a common level:
    the split that evens them out as far as `demand` allows. Ties by name."""
    order = sorted(levels, key=lambda name: (levels[name], name))
    total, count, level = max(0.0, demand), 0, 0.0
    for count, name in enumerate(order, start=1):
        total += levels[name]
        level = total / count
        if count == len(order) or level <= levels[order[count]]:
            break
    return {name: max(0.0, level - levels[name]) if index < count else 0.0 for index, name in enumerate(order)}


def water_fill(
    base: Mapping[str, float], fluid: Mapping[str, tuple[float, Sequence[str]]]
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Each child's compute load, and each fluid model's compute on each of its children.

    `base` is every child's load from models that are not fluid (children named by a fluid model must be
    in it); `fluid` maps a model to its demand and its children. Each fluid model starts evenly split and is
    then water-filled (`_fill_one`) against the others' loads, models in name order, sweep after sweep
    until no split changes (this minimises the sum of squared loads: as even as the replica sets allow).
    Deterministic for the same arguments.
    """
    names = sorted(base)
    order = sorted(fluid)
    splits: dict[str, dict[str, float]] = {}
    loads = {name: float(base[name]) for name in names}
    for model_id in order:
        demand, children = fluid[model_id]
        hosts = sorted(set(children))
        splits[model_id] = dict.fromkeys(hosts, max(0.0, demand) / len(hosts)) if hosts else {}
        for host in hosts:
            loads[host] += splits[model_id][host]
    active = [model_id for model_id in order if len(splits[model_id]) > 1 and fluid[model_id][0] > 0]
    tolerance = _EPSILON * 1e-3 * (1.0 + sum(abs(value) for value in loads.values()))
    for _ in range(_WATER_FILL_SWEEPS if active else 0):
        change = 0.0
        for model_id in active:
            old = splits[model_id]
            new = _fill_one(fluid[model_id][0], {host: loads[host] - old[host] for host in old})
            for host in old:
                change = max(change, abs(new[host] - old[host]))
                loads[host] += new[host] - old[host]
            splits[model_id] = new
        if change <= tolerance:
            break
    loads = {name: float(base[name]) for name in names}
    for model_id in order:
        for host, share in sorted(splits[model_id].items()):
            loads[host] += share
    return loads, splits


def replica_loads(models: Sequence[ModelDemand], placement: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """Each placed model's compute on each of its children as the packer counts it: fluid replicated models
    water-filled over their replicas (`water_fill`), the others evenly."""
    children = sorted({child for hosts in placement.values() for child in hosts})
    base = dict.fromkeys(children, 0.0)
    fluid: dict[str, tuple[float, tuple[str, ...]]] = {}
    even: dict[str, dict[str, float]] = {}
    for model in sorted(models, key=lambda model: model.model_id):
        hosts = tuple(sorted(set(placement.get(model.model_id, ()))))
        if not hosts:
            continue
        if model.fluid and len(hosts) > 1:
            fluid[model.model_id] = (model.compute, hosts)
        else:
            even[model.model_id] = dict.fromkeys(hosts, model.compute / len(hosts))
            for host in hosts:
                base[host] += model.compute / len(hosts)
    _, splits = water_fill(base, fluid)
    return {**even, **splits}


def _lower(profile: Sequence[float], other: Sequence[float]) -> bool:
    """Whether sorted pressures `profile` are lower than `other`: at the first that differ by more than
    rounding (highest first)."""
    for mine, theirs in zip(profile, other, strict=True):
        if mine < theirs - _EPSILON:
            return True
        if mine > theirs + _EPSILON:
            return False
    return False


# --- the bins --------------------------------------------------------------------------------------------


@attrs.frozen
class _State:
    fixed: dict[str, float]
    memory: dict[str, int]
    fluid: dict[str, tuple[float, tuple[str, ...]]]


class _Bins:
    """The compute load and resident bytes each child would carry, updated as replicas land: `fixed`
    compute from models split evenly, and fluid replicated models water-filled on demand."""

    def __init__(self, children: Sequence[ChildCapacity], total_compute: float) -> None:
        self._budget = {child.name: child.memory_budget_bytes for child in children}
        self._fair_share = total_compute / len(children) if children and total_compute > 0 else 0.0
        self.names = sorted(self._budget)
        self._fixed = dict.fromkeys(self.names, 0.0)
        self.memory = dict.fromkeys(self.names, 0)
        self._fluid: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._pressures: dict[str, float] | None = None

    def __contains__(self, child: str) -> bool:
        return child in self._budget

    def fits(self, child: str, memory_bytes: int) -> bool:
        budget = self._budget[child]
        return budget is None or self.memory[child] + memory_bytes <= budget

    def place(self, model: ModelDemand, children: tuple[str, ...], compute: float | None = None) -> None:
        """Put the model (or `compute` of it, while its replicas are being chosen) on `children`."""
        compute = model.compute if compute is None else compute
        if model.fluid and len(children) > 1:
            self._fluid[model.model_id] = (compute, children)
        else:
            for child in children:
                self._fixed[child] += compute / len(children)
        for child in children:
            self.memory[child] += model.memory_bytes
        self._pressures = None

    def remove(self, model: ModelDemand, children: tuple[str, ...], compute: float | None = None) -> None:
        """Undo `place` with the same arguments."""
        compute = model.compute if compute is None else compute
        if model.fluid and len(children) > 1:
            del self._fluid[model.model_id]
        else:
            for child in children:
                self._fixed[child] -= compute / len(children)
        for child in children:
            self.memory[child] -= model.memory_bytes
        self._pressures = None

    def save(self) -> _State:
        return _State(dict(self._fixed), dict(self.memory), dict(self._fluid))

    def restore(self, state: _State) -> None:
        self._fixed, self.memory, self._fluid = dict(state.fixed), dict(state.memory), dict(state.fluid)
        self._pressures = None

    def pressures(self) -> dict[str, float]:
        """Each child's pressure (seed: the closer of compute and memory to full), fluid models water-filled."""
        if self._pressures is None:
            loads, _ = water_fill(self._fixed, self._fluid)
            pressures = {}
            for name in self.names:
                compute_pressure = loads[name] / self._fair_share if self._fair_share else 0.0
                budget = self._budget[name]
                memory_pressure = self.memory[name] / budget if budget else 0.0
                pressures[name] = max(compute_pressure, memory_pressure)
            self._pressures = pressures
        return self._pressures

    def pressure(self, child: str) -> float:
        return self.pressures()[child]

    def profile(self) -> tuple[float, ...]:
        """The children's pressures, highest first (what placements are compared by)."""
        return tuple(sorted(self.pressures().values(), reverse=True))


def _choose(
    bins: _Bins, model: ModelDemand, previous: tuple[str, ...], forbid_oversubscription: bool
) -> tuple[tuple[str, ...], bool]:
    """The model's children, one replica at a time onto the child that leaves the pressures lowest (ties: a
    child it was on before, then the lower pressure before adding, then the name); the model is left placed
    there. Also whether any replica had to go where its weights do not fit."""
    share = model.compute / max(1, model.replicas)
    chosen: tuple[str, ...] = ()
    oversubscribed = False
    for _ in range(min(model.replicas, len(bins.names))):
        free = [name for name in bins.names if name not in chosen]
        fitting = [name for name in free if bins.fits(name, model.memory_bytes)]
        if forbid_oversubscription and fitting:
            free = fitting
        before = bins.pressures()
        if chosen:
            bins.remove(model, chosen, share * len(chosen))
        state = bins.save()
        best: tuple[tuple[float, ...], tuple[bool, float, str]] | None = None
        for name in free:
            trial = tuple(sorted((*chosen, name)))
            bins.place(model, trial, share * len(trial))
            profile, tie = bins.profile(), (name not in previous, before[name], name)
            bins.restore(state)
            if best is None or _lower(profile, best[0]) or (not _lower(best[0], profile) and tie < best[1]):
                best = (profile, tie)
        if best is None:  # no child left (cannot happen: fewer replicas than children)
            break
        oversubscribed = oversubscribed or not bins.fits(best[1][2], model.memory_bytes)
        chosen = tuple(sorted((*chosen, best[1][2])))
        bins.place(model, chosen, share * len(chosen))
    return chosen, oversubscribed


def _heaviest_first(models: Sequence[ModelDemand]) -> list[ModelDemand]:
    return sorted(models, key=lambda model: (-model.compute, -model.memory_bytes, model.model_id))


def pack(
    models: Sequence[ModelDemand],
    children: Sequence[ChildCapacity],
    previous: Mapping[str, tuple[str, ...]],
    hysteresis: float = 0.0,
    forbid_oversubscription: bool = True,
    refine_steps: int = DEFAULT_REFINE_STEPS,
) -> PackResult:
    """A whole new placement of `models` on `children` (a repack); deterministic for the same arguments.

    A single-replica model stays on its previous child unless moving lowers its resulting pressure by more
    than `hysteresis` (and its weights still fit there, when that is required). Then at most `refine_steps`
    refinement steps (see the module docstring; 0 keeps the greedy placement).
    """
    bins = _Bins(children, sum(model.compute for model in models))
    placement: dict[str, tuple[str, ...]] = {}
    held: dict[str, tuple[str, ...]] = {}
    oversubscribed: list[str] = []
    max_improvement = 0.0
    for model in _heaviest_first(models):
        before = tuple(child for child in previous.get(model.model_id, ()) if child in bins)
        chosen, overfull = _choose(bins, model, before, forbid_oversubscription)
        if model.replicas == 1 and len(before) == 1 and chosen != before:
            improvement = _improvement(bins, model, before[0], chosen[0], forbid_oversubscription)
            max_improvement = max(max_improvement, improvement)
            if improvement <= hysteresis:
                bins.remove(model, chosen)
                bins.place(model, before)
                chosen, overfull = before, False
                held[model.model_id] = before
        placement[model.model_id] = chosen
        if overfull:
            oversubscribed.append(model.model_id)
    movable = [
        model
        for model in models
        if model.replicas == 1 and len(placement[model.model_id]) == 1 and model.model_id not in oversubscribed
    ]
    refinement = _Refinement(bins, movable, placement, previous, hysteresis)
    steps = refinement.run(refine_steps)
    return PackResult(
        placement=placement,
        moved=_moves(placement, previous),
        held_by_hysteresis=tuple(
            sorted(model_id for model_id, child in {**refinement.held, **held}.items() if placement[model_id] == child)
        ),
        oversubscribed=tuple(sorted(oversubscribed)),
        max_improvement=max(max_improvement, refinement.max_improvement),
        refine_steps=steps,
    )


# A refinement step: (model, from child, to child) for each model it moves.
_Step = tuple[tuple[str, str, str], ...]


class _Refinement:
    """The local improvement after the greedy pass (see the module docstring); edits `placement` in place.

    Each step is the move of one model to another child, or the swap of two models on different children,
    that leaves the water-filled pressures lowest (compared highest first), among the steps that lower
    them at all, fit the weights and clear the hysteresis; ties go to the first in model and child name
    order.
    """

    def __init__(
        self,
        bins: _Bins,
        movable: Sequence[ModelDemand],
        placement: dict[str, tuple[str, ...]],
        previous: Mapping[str, tuple[str, ...]],
        hysteresis: float,
    ) -> None:
        self._bins = bins
        self._models = {model.model_id: model for model in movable}
        self._placement = placement
        self._previous = previous
        self._hysteresis = hysteresis
        self.max_improvement = 0.0
        # Models a step would have taken off their previous child but for the hysteresis, and that child.
        self.held: dict[str, tuple[str, ...]] = {}

    def run(self, limit: int) -> int:
        """Take up to `limit` steps; how many were taken."""
        for taken in range(max(0, limit)):
            step = self._best_step()
            if step is None:
                return taken
            self._apply(step)
            for model_id, _, target in step:
                self._placement[model_id] = (target,)
        return max(0, limit)

    def _apply(self, step: _Step) -> None:
        for model_id, source, target in step:
            model = self._models[model_id]
            self._bins.remove(model, (source,))
            self._bins.place(model, (target,))

    def _best_step(self) -> _Step | None:
        before = dict(self._bins.pressures())
        ids = sorted(self._models)
        best: tuple[tuple[float, ...], _Step] | None = None
        for index, model_id in enumerate(ids):
            source = self._placement[model_id][0]
            steps: list[_Step] = [((model_id, source, target),) for target in self._bins.names if target != source]
            for other_id in ids[index + 1 :]:
                other_source = self._placement[other_id][0]
                if other_source != source:
                    steps.append(((model_id, source, other_source), (other_id, other_source, source)))
            for step in steps:
                after = self._evaluate(step, before)
                if after is not None and (best is None or _lower(after, best[0])):
                    best = (after, step)
        return best[1] if best is not None else None

    def _evaluate(self, step: _Step, before: Mapping[str, float]) -> tuple[float, ...] | None:
        """The pressures after `step` (highest first), or None when it is not allowed or does not help."""
        state = self._bins.save()
        self._apply(step)
        grown = [child for child in self._bins.names if self._bins.memory[child] > state.memory[child]]
        fits = all(self._bins.fits(child, 0) for child in grown)
        after, after_profile = dict(self._bins.pressures()), self._bins.profile()
        self._bins.restore(state)
        touched = {child for _, source, target in step for child in (source, target)}
        touched.update(child for child in self._bins.names if abs(after[child] - before[child]) > _EPSILON)
        gain = max(before[child] for child in touched) - max(after[child] for child in touched)
        if not fits or gain <= _EPSILON:
            return None
        leaving_previous = {
            model_id: (source,) for model_id, source, _ in step if self._previous.get(model_id) == (source,)
        }
        if leaving_previous:
            self.max_improvement = max(self.max_improvement, gain)
            if gain <= self._hysteresis:
                self.held.update(leaving_previous)
                return None
        return after_profile


def _improvement(bins: _Bins, model: ModelDemand, old: str, new: str, forbid_oversubscription: bool) -> float:
    """How much lower the model's resulting pressure is on `new` than it would be on `old` (already placed on
    `new`); infinite when `old` cannot hold it and `new` can, so that hysteresis never keeps it there."""
    on_new = bins.pressure(new)
    state = bins.save()
    bins.remove(model, (new,))
    fits_old, fits_new = bins.fits(old, model.memory_bytes), bins.fits(new, model.memory_bytes)
    bins.place(model, (old,))
    on_old = bins.pressure(old)
    bins.restore(state)
    must_move = forbid_oversubscription and fits_new and not fits_old
    return float("inf") if must_move else on_old - on_new


def _moves(placement: Mapping[str, tuple[str, ...]], previous: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    moves = []
    for model_id in sorted(placement):
        before = tuple(sorted(previous.get(model_id, ())))
        if before and before != placement[model_id]:
            moves.append(f"{model_id} {','.join(before)}→{','.join(placement[model_id]) or '-'}")
    return tuple(moves)


def place_one(
    model: ModelDemand,
    children: Sequence[ChildCapacity],
    placed: Mapping[str, tuple[str, ...]],
    demands: Mapping[str, ModelDemand],
    forbid_oversubscription: bool = True,
) -> tuple[str, ...]:
    """Children for one model placed on its own (a model seen for the first time, or one that lost every
    replica) next to the models already `placed`, by the same rule as `pack`'s greedy pass."""
    others = [demands[model_id] for model_id in placed if model_id in demands and model_id != model.model_id]
    bins = _Bins(children, model.compute + sum(other.compute for other in others))
    for other in sorted(others, key=lambda other: other.model_id):
        hosts = tuple(sorted(child for child in placed[other.model_id] if child in bins))
        if hosts:
            bins.place(other, hosts, other.compute * len(hosts) / len(placed[other.model_id]))
    chosen, _ = _choose(bins, model, (), forbid_oversubscription)
    return chosen
