"""lpt_packing's routing inside one model's replica set (seed 002 "The fill quantum"): runs of a fill
quantum on one replica (`run`), in-flight items evened out (`spread`), or a quantum of batches in flight
(`inflight`); at each run boundary the opening replica is the least busy child (`fill_least`) or the next in
turn (`fill_rr`). Exact ties rotate. The router hands it a `FillView` of the live counters; nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs


def next_after(names: Sequence[str], last: str | None) -> str:
    """The first of `names` (in name order) after `last`, wrapping around: how exact ties rotate."""
    ordered = sorted(names)
    if last is None:
        return ordered[0]
    return next((name for name in ordered if name > last), ordered[0])


def least(values: Mapping[str, float], last: str | None) -> str:
    """The name with the smallest value; an exact tie goes to the next one after `last`."""
    low = min(values.values())
    return next_after([name for name, value in values.items() if value == low], last)


@attrs.frozen
class FillView:
    """One decision's inputs for one model: its replicas (non-empty), its fill mode and quantum (items, or
    batches under `inflight`), the routing policy, and per replica: the model's items and batches in flight
    there and the child's in-flight work over all models (in work_basis units)."""

    replicas: tuple[str, ...]
    fill_mode: str
    quantum: int
    routing_policy: str
    model_items: Mapping[str, int]
    model_batches: Mapping[str, int]
    child_work: Mapping[str, float]


@attrs.define
class _Run:
    replica: str
    items: int = 0


class FillRouter:
    """Per-model run state: the replica of the current run, the items routed in it, and the last choice."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._last: dict[str, str] = {}

    def choose(self, model_id: str, units: int, view: FillView) -> str:
        """The replica for one batch of `units` items of `model_id`."""
        last = self._last.get(model_id)
        if len(view.replicas) == 1:
            replica = view.replicas[0]
        elif view.fill_mode == "spread":
            replica = least({name: float(view.model_items[name]) for name in view.replicas}, last)
        else:
            run = self._runs.get(model_id)
            if run is None or not self._run_continues(run, view):
                run = _Run(self._open(view, last))
                self._runs[model_id] = run
            run.items += units
            replica = run.replica
        self._last[model_id] = replica
        return replica

    @staticmethod
    def _run_continues(run: _Run, view: FillView) -> bool:
        if run.replica not in view.replicas:
            return False
        if view.fill_mode == "inflight":
            return view.model_batches[run.replica] < view.quantum
        if run.items >= view.quantum or sum(view.model_items[name] for name in view.replicas) == 0:
            return False
        # A replica a whole quantum behind the least backed-up one loses its turn (seed: slow replicas).
        behind = view.model_items[run.replica] - min(view.model_items[name] for name in view.replicas)
        return behind < view.quantum

    @staticmethod
    def _open(view: FillView, last: str | None) -> str:
        if view.routing_policy == "fill_rr":
            return next_after(view.replicas, last)
        return least({name: view.child_work[name] for name in view.replicas}, last)

    def forget(self, model_id: str) -> None:
        """Drop the model's current run (its replicas changed), so the next batch opens a new one."""
        self._runs.pop(model_id, None)
