"""Compaction (seed 002 `compaction_mode`, `compaction_interval`): after a repack moves a model's replicas, the
children it left still hold its weights; compaction names those (child, model) pairs so the fleet unloads them, and
a repack does not leave memory behind.

Every `compaction_interval` repacks a compaction starts. While it is pending, each probe round asks `due` for the
pairs to unload now: a model loaded on a ready child that holds no replica of it, once every replica of the model
is ready with it loaded (traffic never loses its last serving copy). `eager` unloads such a pair when no batch of
the model is in flight on that child; `scheduled` waits until that child has no batch in flight at all. The
compaction ends when no such pair is left (a pair the child declined to unload, a model preloaded there or still
generating, is left for the next compaction). `off`, or an interval of 0, never compacts (the worker's LRU frees
memory when it must). Pure bookkeeping: the fleet does the unloading and reports back through `unloaded`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sie.placement.policy import COMPACTION_OFF, COMPACTION_SCHEDULED, PlacementPolicy
from sie.placement.reports import ChildReport
from sie.placement.snapshot import CompactionState

# Whether (child, model) has a batch in flight: the model's own on that child, or any at all when model is None.
Busy = Callable[[str, str | None], bool]


class Compaction:
    """Counts repacks toward the next compaction and, while one is pending, names the pairs to unload."""

    def __init__(self) -> None:
        self._pending = False
        self._repacks_since = 0
        self._started = 0
        self._unloads = 0
        self._freed_bytes = 0
        self._declined: set[tuple[str, str]] = set()

    def after_repack(self, policy: PlacementPolicy) -> None:
        """Count one repack; start a compaction when it is the `compaction_interval`-th since the last one."""
        if not _enabled(policy):
            return
        self._repacks_since += 1
        if self._repacks_since >= policy.compaction_interval:
            self._repacks_since = 0
            self._pending = True
            self._started += 1
            self._declined.clear()

    def due(
        self,
        policy: PlacementPolicy,
        children: Sequence[ChildReport],
        placement: Mapping[str, tuple[str, ...]],
        busy: Busy,
    ) -> list[tuple[str, str]]:
        """The (child, model) pairs to unload now, in name order; ends the compaction when none is left to wait for."""
        if not self._pending:
            return []
        if not _enabled(policy):
            self._pending = False
            return []
        by_name = {child.name: child for child in children}
        due: list[tuple[str, str]] = []
        waiting = False
        for child in sorted(children, key=lambda child: child.name):
            if not child.ready:
                continue
            for model_id in sorted(model_id for model_id, model in child.models.items() if model.loaded):
                replicas = placement.get(model_id, ())
                if not replicas or child.name in replicas or (child.name, model_id) in self._declined:
                    continue
                if not _serving(model_id, replicas, by_name) or _busy(policy, busy, child.name, model_id):
                    waiting = True
                    continue
                due.append((child.name, model_id))
        if not due and not waiting:
            self._pending = False
        return due

    def unloaded(self, child: str, model_id: str, freed_bytes: int | None) -> None:
        """The fleet unloaded a pair `due` named, freeing `freed_bytes`; None: the child kept it (preloaded there, or
        generating), so this compaction leaves it alone."""
        if freed_bytes is None:
            self._declined.add((child, model_id))
            return
        self._unloads += 1
        self._freed_bytes += max(0, freed_bytes)

    def state(self) -> CompactionState:
        return CompactionState(
            pending=self._pending,
            compactions_total=self._started,
            unloads_total=self._unloads,
            freed_bytes_total=self._freed_bytes,
        )


def _enabled(policy: PlacementPolicy) -> bool:
    return policy.compaction_mode != COMPACTION_OFF and policy.compaction_interval > 0


def _serving(model_id: str, replicas: tuple[str, ...], by_name: Mapping[str, ChildReport]) -> bool:
    """Every replica of the model is ready with it loaded."""
    for name in replicas:
        child = by_name.get(name)
        model = child.models.get(model_id) if child is not None else None
        if child is None or not child.ready or model is None or not model.loaded:
            return False
    return True


def _busy(policy: PlacementPolicy, busy: Busy, child: str, model_id: str) -> bool:
    return busy(child, None if policy.compaction_mode == COMPACTION_SCHEDULED else model_id)
