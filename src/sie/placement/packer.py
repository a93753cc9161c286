"""LPT packing (seed 002 "lpt_packing"): place each model's replicas on distinct children, heaviest first,
each on the least pressured child, where pressure is whichever of compute load (against a fair share) or
resident weights (against the child's budget) is closer to full. Pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs


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
    models kept on their old child because the move gained no more than the hysteresis; `oversubscribed`
    lists models placed where their weights do not fit because no child could hold them; `max_improvement`
    is the largest pressure gain any single-replica model could have had by moving.
    """

    placement: Mapping[str, tuple[str, ...]]
    moved: tuple[str, ...] = ()
    held_by_hysteresis: tuple[str, ...] = ()
    oversubscribed: tuple[str, ...] = ()
    max_improvement: float = 0.0


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
) -> PackResult:
    """A whole new placement of `models` on `children` (a repack); deterministic for the same arguments.

    A single-replica model stays on its previous child unless moving lowers its resulting pressure by more
    than `hysteresis` (and its weights still fit there, when that is required).
    """
    bins = _Bins(children, sum(model.compute for model in models))
    placement: dict[str, tuple[str, ...]] = {}
    held: list[str] = []
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
                held.append(model.model_id)
        placement[model.model_id] = chosen
        if overfull:
            oversubscribed.append(model.model_id)
    return PackResult(
        placement=placement,
        moved=_moves(placement, previous),
        held_by_hysteresis=tuple(sorted(held)),
        oversubscribed=tuple(sorted(oversubscribed)),
        max_improvement=max_improvement,
    )


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
