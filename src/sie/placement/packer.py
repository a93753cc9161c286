"""LPT packing (seed 002 "lpt_packing"): place each model's replicas on distinct children, heaviest first,
each on the least pressured child, where pressure is whichever of compute load (against a fair share) or
resident weights (against the child's budget) is closer to full. Pure functions of their arguments.

Refinement (our addition on top of the seed's LPT): heaviest-first greedy placement can leave children
uneven when a few models carry most of the demand (8 models with shares 0.24, 0.19, 0.13, 0.12, 0.10, 0.08,
0.07, 0.07 on 4 children: greedy gives 0.22..0.28 against a fair 0.25, where 0.24..0.26 exists). After the
greedy pass `pack` therefore runs a bounded local improvement over the single-replica models: moving one
model to another child, or swapping two models on different children. A step is taken only when it lowers
the larger pressure of the two children it touches, so the fleet's highest pressure never rises and every
step makes the sorted pressures strictly smaller (it terminates; `refine_steps`, 64 by default, only bounds
the work). A step never adds weights to a child where they do not fit, whatever `forbid_oversubscription`
says, and a step that takes a model off the child it had before the repack must lower that larger
pressure by more than the hysteresis, as the greedy pass requires of a move (such a model is reported held
by hysteresis). The step taken relieves the most pressured child some step can relieve, leaving the lower
pressure, ties by model and child names, so the result is deterministic. Replicated models and models
placed where their weights do not fit stay where the greedy pass put them; the pressures still count a
replicated model's compute evenly over its replicas, as the greedy pass does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

# Steps of the local improvement after the greedy pass (each strictly improves; this only bounds the work).
DEFAULT_REFINE_STEPS = 64
# Pressure differences below this are rounding, not improvement.
_EPSILON = 1e-9


@attrs.frozen
class ModelDemand:
    """One model to place: its compute demand (any unit shared by all models), resident weight bytes (0 when
    unknown) and how many distinct children it goes on (already capped by the number of children)."""

    model_id: str
    compute: float
    memory_bytes: int
    replicas: int


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


class _Bins:
    """The compute load and resident bytes each child would carry, updated as replicas land."""

    def __init__(self, children: Sequence[ChildCapacity], total_compute: float) -> None:
        self._budget = {child.name: child.memory_budget_bytes for child in children}
        self._fair_share = total_compute / len(children) if children and total_compute > 0 else 0.0
        self.compute = dict.fromkeys(self._budget, 0.0)
        self.memory = dict.fromkeys(self._budget, 0)

    @property
    def names(self) -> list[str]:
        return sorted(self._budget)

    def fits(self, child: str, memory_bytes: int) -> bool:
        budget = self._budget[child]
        return budget is None or self.memory[child] + memory_bytes <= budget

    def pressure(self, child: str, compute: float = 0.0, memory_bytes: int = 0) -> float:
        """The child's pressure after adding `compute` and `memory_bytes` (seed: the closer of the two to full)."""
        compute_pressure = (self.compute[child] + compute) / self._fair_share if self._fair_share else 0.0
        budget = self._budget[child]
        memory_pressure = (self.memory[child] + memory_bytes) / budget if budget else 0.0
        return max(compute_pressure, memory_pressure)

    def add(self, child: str, compute: float, memory_bytes: int) -> None:
        self.compute[child] += compute
        self.memory[child] += memory_bytes

    def after(self, child: str, compute: float, memory_bytes: int) -> tuple[float, bool]:
        """The child's pressure after a change of `compute` and `memory_bytes`, and whether its weights still
        fit (a change that adds no bytes never breaks the fit)."""
        budget = self._budget[child]
        fits = memory_bytes <= 0 or budget is None or self.memory[child] + memory_bytes <= budget
        return self.pressure(child, compute, memory_bytes), fits


def _choose(
    bins: _Bins, model: ModelDemand, previous: tuple[str, ...], forbid_oversubscription: bool
) -> tuple[tuple[str, ...], bool]:
    """The model's children, one replica at a time onto the least pressured child after adding it (ties: a
    child it was on before, then the lower pressure before adding, then the name). Also whether any replica
    had to go where its weights do not fit."""
    share = model.compute / max(1, model.replicas)
    chosen: list[str] = []
    oversubscribed = False
    for _ in range(min(model.replicas, len(bins.names))):
        free = [name for name in bins.names if name not in chosen]
        fitting = [name for name in free if bins.fits(name, model.memory_bytes)]
        if forbid_oversubscription and fitting:
            free = fitting
        best = min(
            free,
            key=lambda name: (
                bins.pressure(name, share, model.memory_bytes),
                name not in previous,
                bins.pressure(name),
                name,
            ),
        )
        oversubscribed = oversubscribed or not bins.fits(best, model.memory_bytes)
        chosen.append(best)
        bins.add(best, share, model.memory_bytes)
    return tuple(sorted(chosen)), oversubscribed


def _undo(bins: _Bins, model: ModelDemand, children: tuple[str, ...]) -> None:
    for child in children:
        bins.add(child, -model.compute / max(1, model.replicas), -model.memory_bytes)


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
        before = tuple(child for child in previous.get(model.model_id, ()) if child in bins.compute)
        chosen, overfull = _choose(bins, model, before, forbid_oversubscription)
        if model.replicas == 1 and len(before) == 1 and chosen != before:
            improvement = _improvement(bins, model, before[0], chosen[0], forbid_oversubscription)
            max_improvement = max(max_improvement, improvement)
            if improvement <= hysteresis:
                _undo(bins, model, chosen)
                bins.add(before[0], model.compute, model.memory_bytes)
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


class _Refinement:
    """The local improvement after the greedy pass (see the module docstring); edits `placement` in place.

    Each step relieves the most pressured child that some step can relieve: children are tried from the
    highest pressure down (ties by name), and for the first that has one, the step out of it (a move to a
    child no more pressured, or a swap with a model there) that leaves the pair's larger pressure lowest
    goes, ties by model and child names. Only a step that takes weight off a child can lower its pressure,
    so the steps tried out of a child are its models leaving, alone or in exchange for a lighter one.
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
            for model_id, source, target in step:
                model = self._models[model_id]
                self._bins.add(source, -model.compute, -model.memory_bytes)
                self._bins.add(target, model.compute, model.memory_bytes)
                self._placement[model_id] = (target,)
        return max(0, limit)

    def _best_step(self) -> tuple[tuple[str, str, str], ...] | None:
        on: dict[str, list[ModelDemand]] = {name: [] for name in self._bins.names}
        for model_id in sorted(self._models):
            on[self._placement[model_id][0]].append(self._models[model_id])
        ranked = sorted(on, key=lambda name: (-self._bins.pressure(name), name))
        for index, first in enumerate(ranked):
            best: tuple[float, tuple[str, ...], str, tuple[tuple[str, str, str], ...]] | None = None
            for second in ranked[index + 1 :]:
                for model in on[first]:
                    for other in (None, *on[second]):
                        found = self._evaluate(first, second, model, other)
                        if found is not None and (best is None or found[:3] < best[:3]):
                            best = found
            if best is not None:
                return best[3]
        return None

    def _evaluate(
        self, first: str, second: str, model: ModelDemand, other: ModelDemand | None
    ) -> tuple[float, tuple[str, ...], str, tuple[tuple[str, str, str], ...]] | None:
        """`model` from `first` to `second` (and `other` back, for a swap): (the pair's larger pressure after,
        the models, the second child, the moves), or None when that is not allowed or does not help."""
        compute = model.compute - (other.compute if other is not None else 0.0)
        memory = model.memory_bytes - (other.memory_bytes if other is not None else 0)
        if compute <= 0 and memory <= 0:
            return None  # nothing comes off the more pressured child
        on_first, fits_first = self._bins.after(first, -compute, -memory)
        on_second, fits_second = self._bins.after(second, compute, memory)
        after = max(on_first, on_second)
        gain = max(self._bins.pressure(first), self._bins.pressure(second)) - after
        if not (fits_first and fits_second) or gain <= _EPSILON:
            return None
        moves = ((model.model_id, first, second),)
        if other is not None:
            moves += ((other.model_id, second, first),)
        leaving_previous = {
            model_id: (source,) for model_id, source, _ in moves if self._previous.get(model_id) == (source,)
        }
        if leaving_previous:
            self.max_improvement = max(self.max_improvement, gain)
            if gain <= self._hysteresis:
                self.held.update(leaving_previous)
                return None
        return after, tuple(sorted(model_id for model_id, _, _ in moves)), second, moves


def _improvement(bins: _Bins, model: ModelDemand, old: str, new: str, forbid_oversubscription: bool) -> float:
    """How much lower the model's resulting pressure is on `new` than it would be on `old` (already placed on
    `new`); infinite when `old` cannot hold it and `new` can, so that hysteresis never keeps it there."""
    on_new = bins.pressure(new)
    bins.add(new, -model.compute, -model.memory_bytes)
    on_old = bins.pressure(old, model.compute, model.memory_bytes)
    fits_old, fits_new = bins.fits(old, model.memory_bytes), bins.fits(new, model.memory_bytes)
    must_move = forbid_oversubscription and fits_new and not fits_old
    bins.add(new, model.compute, model.memory_bytes)
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
    replica) next to the models already `placed`, by the same least-pressured rule as `pack`."""
    others = [demands[model_id] for model_id in placed if model_id in demands and model_id != model.model_id]
    bins = _Bins(children, model.compute + sum(other.compute for other in others))
    for other in others:
        for child in placed[other.model_id]:
            if child in bins.compute:
                bins.add(child, other.compute / len(placed[other.model_id]), other.memory_bytes)
    chosen, _ = _choose(bins, model, (), forbid_oversubscription)
    return chosen
