"""The fleet as its children last reported it: the table `Placement.update` swaps in whole, the fleet compute
clock accrued from each child's `compute_seconds_total`, and each model's facts merged over the children
(batch axis, max batch, measured cost per item, resident bytes).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

import attrs

from sie.placement.reports import ChildReport, ModelReport


@attrs.frozen
class ModelFacts:
    """One model as the children report it together: the largest max batch and resident size any reports,
    whether any reports a batch axis, and the mean of the measured costs per item (None: none measured)."""

    model_id: str
    batched: bool
    max_batch_items: int
    cost_per_item_s: float | None
    memory_bytes: int

    @property
    def counts_items(self) -> bool:
        """False for a model with no batch axis: it counts one unit per batch (seed 002 "no batch axis")."""
        return self.batched and self.max_batch_items > 1


class ReportTable:
    """The last report of every child, and the fleet compute consumed since placement started."""

    def __init__(self) -> None:
        self._children: dict[str, ChildReport] = {}
        self._last_total: dict[str, float] = {}
        self._facts: dict[str, ModelFacts] = {}
        self.fleet_compute = 0.0

    def update(self, children: Sequence[ChildReport]) -> float:
        """Swap in a new set of reports; return the device-seconds the fleet consumed since the last one.

        A child's first report sets its baseline (work before placement saw it is not counted); a total
        lower than the last one means the child restarted, so its whole new total counts.
        """
        consumed = 0.0
        for child in children:
            last = self._last_total.get(child.name)
            if last is not None:
                total = child.compute_seconds_total
                consumed += total - last if total >= last else total
            self._last_total[child.name] = child.compute_seconds_total
        self._children = {child.name: child for child in sorted(children, key=lambda child: child.name)}
        self._facts = _merge_facts(self._children.values())
        self.fleet_compute += consumed
        return consumed

    @property
    def children(self) -> tuple[ChildReport, ...]:
        """Every reported child, in name order."""
        return tuple(self._children.values())

    def child(self, name: str) -> ChildReport | None:
        return self._children.get(name)

    def ready(self) -> tuple[str, ...]:
        """The names of the ready children, in name order."""
        return tuple(name for name, child in self._children.items() if child.ready)

    def facts(self, model_id: str) -> ModelFacts | None:
        return self._facts.get(model_id)

    def models(self, ready_only: bool = False) -> tuple[str, ...]:
        """Every model some child (some ready child) reports, loaded or not, in name order."""
        if not ready_only:
            return tuple(sorted(self._facts))
        return tuple(sorted({model for child in self._children.values() if child.ready for model in child.models}))

    def fleet_mean_cost(self) -> float | None:
        """The mean measured cost per item over the models that have one; what a cold model is charged."""
        costs = [facts.cost_per_item_s for facts in self._facts.values() if facts.cost_per_item_s is not None]
        return statistics.fmean(costs) if costs else None


def _merge_facts(children: Iterable[ChildReport]) -> dict[str, ModelFacts]:
    reports: dict[str, list[ModelReport]] = {}
    for child in children:
        for model_id, report in child.models.items():
            reports.setdefault(model_id, []).append(report)
    facts = {}
    for model_id, found in reports.items():
        costs = [report.cost_per_item_s for report in found if report.cost_per_item_s is not None]
        facts[model_id] = ModelFacts(
            model_id=model_id,
            batched=any(report.batched for report in found),
            max_batch_items=max(report.max_batch_items for report in found),
            cost_per_item_s=statistics.fmean(costs) if costs else None,
            memory_bytes=max(report.memory_bytes for report in found),
        )
    return facts
