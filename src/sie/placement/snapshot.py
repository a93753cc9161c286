"""A read-only picture of placement at one instant, for `GET /v1/placement`, `/metrics` and the CLI.

Built by `Placement.snapshot()`; every number is read live from the router's counters, so a scrape never lags
a probe round. Units of `inflight_work` follow the policy's `work_basis` (compute-seconds, items, or
per-request cost).
"""

from __future__ import annotations

import attrs

from sie.placement.policy import PlacementPolicy


@attrs.frozen
class ChildState:
    """One worker child: its device, readiness, what it has loaded and the work it holds now."""

    name: str
    device: str
    ready: bool
    loaded_models: tuple[str, ...]
    inflight_batches: int
    inflight_items: int
    inflight_work: float
    memory_budget_bytes: int | None
    compute_seconds_total: float


@attrs.frozen
class ReplicaState:
    """One model on one child: its placement weight, items in flight, and batches and items routed there."""

    child: str
    device: str
    weight: float
    outstanding_items: int
    routed_batches: int
    routed_items: int


@attrs.frozen
class ModelPlacement:
    """One model: how many replicas it should have (setting) and has, its fill settings and quantum, its
    demand estimate (compute-seconds per fleet compute-second) and its replicas."""

    model_id: str
    replicas_setting: int | str
    fill_mode: str
    fill_factor: float
    fill_quantum: int
    demand: float
    replicas: tuple[ReplicaState, ...]


@attrs.frozen
class RepackRecord:
    """One repack: when (wall clock), why, what moved, and the compute and wall time since the one before."""

    at: float
    trigger: str
    models_placed: int
    moved: tuple[str, ...]
    held_by_hysteresis: tuple[str, ...]
    compute_seconds: float
    wall_seconds: float


@attrs.frozen
class CompactionState:
    """Compaction so far: whether one is under way, how many started, the models they unloaded and the bytes freed."""

    pending: bool = False
    compactions_total: int = 0
    unloads_total: int = 0
    freed_bytes_total: int = 0


@attrs.frozen
class BatchSizes:
    """Histogram of items per batch for one model on one child (cumulative bucket counts, Prometheus style)."""

    child: str
    device: str
    model_id: str
    buckets: tuple[tuple[float, int], ...]  # (upper bound, cumulative count), the last bound is +inf
    count: int
    total_items: int


@attrs.frozen
class PlacementSnapshot:
    """Everything `GET /v1/placement` and `/metrics` show."""

    policy: PlacementPolicy
    children: tuple[ChildState, ...]
    models: tuple[ModelPlacement, ...]
    repacks_total: tuple[tuple[str, int], ...]  # (trigger, count)
    last_repack: RepackRecord | None
    batch_sizes: tuple[BatchSizes, ...]
    compaction: CompactionState = CompactionState()
