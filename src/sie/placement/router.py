"""`Placement`: the one object the fleet asks where each batch goes (seed 002 "Scheduling modes").

It keeps the table of child reports, the fleet compute clock, lpt_packing's placement with its repacks, and
the in-flight accounting, and answers `choose` for round_robin, least_outstanding and lpt_packing. A
single-threaded state machine: the fleet calls it from one event loop; it does no I/O and reads time only
through the injected clocks.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

from sie.placement.compaction import Compaction
from sie.placement.fill import FillRouter, FillView, least, next_after
from sie.placement.ledger import BATCH_SIZE_BOUNDS, Ledger, Ticket
from sie.placement.packer import ChildCapacity, ModelDemand, pack, place_one
from sie.placement.policy import ALL_REPLICAS, LEAST_OUTSTANDING, LPT_PACKING, ModelOverride, PlacementPolicy
from sie.placement.reports import ChildReport
from sie.placement.snapshot import (
    BatchSizes,
    ChildState,
    ModelPlacement,
    PlacementSnapshot,
    RepackRecord,
    ReplicaState,
)
from sie.placement.table import ReportTable

logger = logging.getLogger(__name__)

# What a batch costs per item when no model has been measured yet: compute then weighs like items.
_UNMEASURED_COST_PER_ITEM_S = 1.0


class Placement:
    """Routes batches to worker children under one PlacementPolicy (see the module docstring)."""

    def __init__(
        self,
        policy: PlacementPolicy,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._wall_clock = wall_clock
        self._table = ReportTable()
        self._ledger = Ledger()
        self._fill = FillRouter()
        self._last_pick: dict[str, str] = {}
        self._placement: dict[str, tuple[str, ...]] = {}
        self._placed_on_all: set[str] = set()
        self._wanted: set[str] = set()
        self._degraded: set[str] = set()
        self._repacks: dict[str, int] = {}
        self._last_repack: RepackRecord | None = None
        self._compaction = Compaction()
        self._compute_at_repack = 0.0
        self._clock_at_repack = clock()
        logger.info("placement: mode %s, work_basis %s", policy.mode, policy.work_basis)

    @property
    def policy(self) -> PlacementPolicy:
        return self._policy

    # --- the table --------------------------------------------------------------------------------------

    def update(self, children: Sequence[ChildReport]) -> None:
        """Swap in one probe round's reports; accrue fleet compute; under lpt_packing keep the placement on
        ready children and repack once the compute budget is spent (an idle fleet never repacks)."""
        consumed = self._table.update(children)
        self._ledger.decay_demand(consumed, self._halflife())
        if self._policy.mode != LPT_PACKING:
            return
        self._follow_ready_children()
        for model_id in sorted({*self._table.models(ready_only=True), *self._wanted}):
            if not self._placement.get(model_id):
                self._place(model_id)
        if self._repack_due():
            self.repack("compute")

    def _halflife(self) -> float:
        return self._policy.ema_halflife_compute_seconds or self._policy.rebalance_compute_seconds

    def _follow_ready_children(self) -> None:
        """Drop children that are not ready from replica sets (their traffic fails over); `all` follows the
        ready set."""
        ready = self._table.ready()
        for model_id, children in self._placement.items():
            kept = ready if model_id in self._placed_on_all else tuple(name for name in children if name in ready)
            if kept != children:
                self._placement[model_id] = kept
                self._fill.forget(model_id)

    def _repack_due(self) -> bool:
        consumed = self._table.fleet_compute - self._compute_at_repack
        first = self._policy.first_rebalance_compute_seconds
        budget = first if self._last_repack is None and first > 0 else self._policy.rebalance_compute_seconds
        return consumed > 0 and consumed >= budget

    # --- placement --------------------------------------------------------------------------------------

    def assigned(self, model_id: str) -> tuple[str, ...]:
        """The children that should host the model now, in name order: every ready child, or under
        lpt_packing its replica set (a model never placed before is placed at once)."""
        ready = self._table.ready()
        if self._policy.mode != LPT_PACKING:
            return ready
        self._wanted.add(model_id)
        if not self._placement.get(model_id):
            self._place(model_id)
        return tuple(name for name in self._placement.get(model_id, ()) if name in ready)

    def _place(self, model_id: str) -> None:
        """Place one model on its own, next to the others, on the least pressured ready children."""
        capacities = self._capacities()
        if not capacities:
            return
        demands = self._demands([*self._placement, model_id], len(capacities))
        chosen = place_one(
            demands[model_id], capacities, self._placement, demands, self._policy.forbid_memory_oversubscription
        )
        self._placement[model_id] = chosen
        self._record_all(model_id)
        self._fill.forget(model_id)
        logger.info("lpt_packing: placed %s on %s", model_id, ",".join(chosen))

    def _record_all(self, model_id: str) -> None:
        if self._policy.replicas_for(model_id) == ALL_REPLICAS:
            self._placed_on_all.add(model_id)
        else:
            self._placed_on_all.discard(model_id)

    def _capacities(self) -> list[ChildCapacity]:
        return [ChildCapacity(child.name, child.memory_budget_bytes) for child in self._table.children if child.ready]

    def _demands(self, model_ids: Sequence[str], children: int) -> dict[str, ModelDemand]:
        """Each model's compute demand (its decayed measured compute; unmeasured ones weigh the mean of the
        measured), resident bytes and replica count capped by the ready children."""
        measured = self._ledger.demand()
        known = [measured[model_id] for model_id in model_ids if measured.get(model_id, 0.0) > 0]
        mean = statistics.fmean(known) if known else 1.0
        demands = {}
        for model_id in model_ids:
            facts = self._table.facts(model_id)
            replicas = self._policy.replicas_for(model_id)
            count = children if replicas == ALL_REPLICAS else min(int(replicas), children)
            demands[model_id] = ModelDemand(
                model_id=model_id,
                compute=measured.get(model_id, 0.0) or mean,
                memory_bytes=facts.memory_bytes if facts is not None else 0,
                replicas=count,
            )
        return demands

    def repack(self, trigger: str = "manual") -> RepackRecord | None:
        """Re-place every model heaviest-first on the ready children (lpt_packing only; None otherwise)."""
        if self._policy.mode != LPT_PACKING:
            return None
        capacities = self._capacities()
        model_ids = sorted({*self._placement, *self._table.models(ready_only=True), *self._wanted})
        demands = self._demands(model_ids, len(capacities))
        result = pack(
            list(demands.values()),
            capacities,
            self._placement,
            self._policy.hysteresis,
            self._policy.forbid_memory_oversubscription,
        )
        for model_id, children in result.placement.items():
            if self._placement.get(model_id) != children:
                self._fill.forget(model_id)
            self._placement[model_id] = children
            self._record_all(model_id)
        now = self._clock()
        record = RepackRecord(
            at=self._wall_clock(),
            trigger=trigger,
            models_placed=sum(1 for children in result.placement.values() if children),
            moved=result.moved,
            held_by_hysteresis=result.held_by_hysteresis,
            compute_seconds=self._table.fleet_compute - self._compute_at_repack,
            wall_seconds=now - self._clock_at_repack,
        )
        self._compute_at_repack, self._clock_at_repack = self._table.fleet_compute, now
        self._repacks[trigger] = self._repacks.get(trigger, 0) + 1
        self._last_repack = record
        self._compaction.after_repack(self._policy)
        self._log_repack(record, result.max_improvement, result.oversubscribed)
        return record

    def _log_repack(self, record: RepackRecord, max_improvement: float, oversubscribed: tuple[str, ...]) -> None:
        moved = f" ({', '.join(record.moved)})" if record.moved else ""
        logger.info(
            "lpt_packing: repack (%s) placed %d models, moved %d%s, held_by_hysteresis %d, max_improvement %.3g "
            "(hysteresis %.3g), compute_seconds %.1f, wall_seconds %.1f",
            record.trigger,
            record.models_placed,
            len(record.moved),
            moved,
            len(record.held_by_hysteresis),
            max_improvement,
            self._policy.hysteresis,
            record.compute_seconds,
            record.wall_seconds,
        )
        if oversubscribed:
            logger.warning(
                "lpt_packing: %s placed where the weights do not fit: no ready child has the memory to hold them",
                ", ".join(oversubscribed),
            )

    # --- compaction -------------------------------------------------------------------------------------

    def compaction_due(self) -> list[tuple[str, str]]:
        """The (child, model) pairs to unload now: models a repack moved off a child, once their new replicas serve
        (lpt_packing only; see `sie.placement.compaction`)."""
        if self._policy.mode != LPT_PACKING:
            return []
        return self._compaction.due(self._policy, self._table.children, self._placement, self._in_flight)

    def compacted(self, child: str, model_id: str, freed_bytes: int | None) -> None:
        """The fleet unloaded a pair `compaction_due` named, freeing `freed_bytes` (None: the child kept it)."""
        self._compaction.unloaded(child, model_id, freed_bytes)

    def _in_flight(self, child: str, model_id: str | None) -> bool:
        if model_id is None:
            return self._ledger.child_load(child).batches > 0
        return self._ledger.replica_load(model_id, child).batches > 0

    # --- routing ----------------------------------------------------------------------------------------

    def choose(self, model_id: str, items: int, candidates: Sequence[str]) -> str | None:
        """The child for one batch of `items` items among `candidates` (children that can run the model now,
        less those that already failed this batch); None when there is none."""
        if not candidates:
            return None
        names = tuple(sorted(set(candidates)))
        last = self._last_pick.get(model_id)
        if self._policy.mode == LPT_PACKING:
            pick = self._choose_lpt(model_id, self._units(model_id, items), names)
        elif self._policy.mode == LEAST_OUTSTANDING:
            pick = least({name: self._work(name) for name in names}, last)
        else:
            pick = next_after(names, last)
        self._last_pick[model_id] = pick
        return pick

    def _choose_lpt(self, model_id: str, units: int, names: tuple[str, ...]) -> str:
        assigned = self.assigned(model_id)
        replicas = tuple(name for name in names if name in assigned)
        if replicas:
            self._degraded.discard(model_id)
        else:
            if model_id not in self._degraded:
                logger.warning(
                    "lpt_packing: no replica of %s (%s) can run it now; routing over %s until placement converges",
                    model_id,
                    ",".join(assigned) or "none",
                    ",".join(names),
                )
                self._degraded.add(model_id)
            replicas = names
        view = FillView(
            replicas=replicas,
            fill_mode=self._policy.fill_mode_for(model_id),
            quantum=self._quantum(model_id),
            routing_policy=self._policy.routing_policy,
            model_items={name: self._ledger.replica_load(model_id, name).items for name in replicas},
            model_batches={name: self._ledger.replica_load(model_id, name).batches for name in replicas},
            child_work={name: self._work(name) for name in replicas},
        )
        return self._fill.choose(model_id, units, view)

    def _units(self, model_id: str, items: int) -> int:
        """Items a batch counts: one for a model with no batch axis, else the items it carries."""
        facts = self._table.facts(model_id)
        if facts is not None and not facts.counts_items:
            return 1
        return max(1, items)

    def _quantum(self, model_id: str) -> int:
        facts = self._table.facts(model_id)
        max_batch = facts.max_batch_items if facts is not None else 1
        return max(1, round(max_batch * self._policy.fill_factor_for(model_id)))

    def _work(self, child: str) -> float:
        """The child's in-flight work as the router compares it, in work_basis units (`requests`: batches
        under least_outstanding, the models' measured cost per request under fill_least)."""
        load = self._ledger.child_load(child)
        if self._policy.work_basis == "compute":
            return load.compute
        if self._policy.work_basis == "items":
            return float(load.items)
        return float(load.batches) if self._policy.mode == LEAST_OUTSTANDING else load.request_cost

    def _cost_per_item(self, model_id: str) -> float:
        facts = self._table.facts(model_id)
        if facts is not None and facts.cost_per_item_s is not None:
            return facts.cost_per_item_s
        return self._table.fleet_mean_cost() or _UNMEASURED_COST_PER_ITEM_S

    # --- accounting -------------------------------------------------------------------------------------

    def started(self, child: str, model_id: str, items: int) -> Ticket:
        """Count one batch as sent to `child`; pass the ticket to `finished` when it ends, however it ends."""
        units = self._units(model_id, items)
        compute = units * self._cost_per_item(model_id)
        per_request = self._ledger.cost_per_batch(model_id) or self._ledger.mean_cost_per_batch() or compute
        return self._ledger.start(child, model_id, items, units, (compute, per_request))

    def finished(self, ticket: Ticket, compute_seconds: float | None = None) -> None:
        """Release the batch's in-flight charge, record its size, and feed its compute (when unknown: its
        items times the model's known cost per item) into the model's demand."""
        if compute_seconds is None:
            facts = self._table.facts(ticket.model_id)
            if facts is not None and facts.cost_per_item_s is not None:
                compute_seconds = ticket.units * facts.cost_per_item_s
        self._ledger.finish(ticket, compute_seconds)

    # --- control ----------------------------------------------------------------------------------------

    def set_policy(self, knobs: Mapping[str, object]) -> PlacementPolicy:
        """Change fleet-wide knobs (all but the mode); PolicyError on a bad name or value."""
        self._policy = self._policy.with_knobs(knobs)
        logger.info("placement: policy changed: %s", ", ".join(f"{key}={value}" for key, value in knobs.items()))
        return self._policy

    def set_model(
        self,
        model_id: str,
        replicas: int | str | None = None,
        fill_mode: str | None = None,
        fill_factor: float | None = None,
    ) -> ModelOverride:
        """Override one model's replicas (in force from the next repack), fill mode or fill factor (from its
        next batch); PolicyError on a bad value."""
        self._policy = self._policy.with_model(model_id, replicas, fill_mode, fill_factor)
        override = self._policy.models[model_id]
        logger.info("placement: %s set to %s", model_id, override.as_dict())
        return override

    # --- the picture ------------------------------------------------------------------------------------

    def snapshot(self) -> PlacementSnapshot:
        """Everything `GET /v1/placement` and `/metrics` show, read from the live counters."""
        return PlacementSnapshot(
            policy=self._policy,
            children=tuple(self._child_state(child) for child in self._table.children),
            models=tuple(self._model_placement(model_id) for model_id in self._known_models()),
            repacks_total=tuple(sorted(self._repacks.items())),
            last_repack=self._last_repack,
            batch_sizes=self._batch_sizes(),
            compaction=self._compaction.state(),
        )

    def _child_state(self, child: ChildReport) -> ChildState:
        load = self._ledger.child_load(child.name)
        return ChildState(
            name=child.name,
            device=child.device,
            ready=child.ready,
            loaded_models=tuple(sorted(model_id for model_id, model in child.models.items() if model.loaded)),
            inflight_batches=load.batches,
            inflight_items=load.items,
            inflight_work=self._work(child.name),
            memory_budget_bytes=child.memory_budget_bytes,
            compute_seconds_total=child.compute_seconds_total,
        )

    def _known_models(self) -> list[str]:
        return sorted({*self._table.models(), *self._ledger.models(), *self._placement, *self._wanted})

    def _model_placement(self, model_id: str) -> ModelPlacement:
        if self._policy.mode == LPT_PACKING:
            children = self._placement.get(model_id, ())
        else:
            children = self._table.ready()
        demand = self._ledger.demand()
        total = sum(demand.values())
        return ModelPlacement(
            model_id=model_id,
            # Outside lpt_packing every ready child serves every model: the setting in force is `all`.
            replicas_setting=self._policy.replicas_for(model_id) if self._policy.mode == LPT_PACKING else ALL_REPLICAS,
            fill_mode=self._policy.fill_mode_for(model_id),
            fill_factor=self._policy.fill_factor_for(model_id),
            fill_quantum=self._quantum(model_id),
            demand=demand.get(model_id, 0.0) / total if total > 0 else 0.0,
            replicas=tuple(self._replica_state(model_id, name, 1.0 / len(children)) for name in children),
        )

    def _replica_state(self, model_id: str, child: str, weight: float) -> ReplicaState:
        report = self._table.child(child)
        routed = self._ledger.routed(model_id, child)
        return ReplicaState(
            child=child,
            device=report.device if report is not None else "",
            weight=weight,
            outstanding_items=self._ledger.replica_load(model_id, child).items,
            routed_batches=routed.batches,
            routed_items=routed.items,
        )

    def _batch_sizes(self) -> tuple[BatchSizes, ...]:
        histograms = []
        for (child, model_id), counts in sorted(self._ledger.batch_sizes().items()):
            report = self._table.child(child)
            cumulative = list(itertools.accumulate(counts))
            histograms.append(
                BatchSizes(
                    child=child,
                    device=report.device if report is not None else "",
                    model_id=model_id,
                    buckets=tuple(zip(BATCH_SIZE_BOUNDS, cumulative, strict=True)),
                    count=cumulative[-1],
                    total_items=self._ledger.batch_items(child, model_id),
                )
            )
        return tuple(histograms)
