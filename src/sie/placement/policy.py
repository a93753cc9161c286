"""The placement policy: seed 002's `scheduling:` block as one immutable value (mode, work basis, repack
budgets, EMA halflife, hysteresis, replicas, fill quantum, routing policy, memory fit) with per-model
overrides. Changed at run time only through validated copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

ROUND_ROBIN: Final = "round_robin"
LEAST_OUTSTANDING: Final = "least_outstanding"
LPT_PACKING: Final = "lpt_packing"
MODES: Final = (ROUND_ROBIN, LEAST_OUTSTANDING, LPT_PACKING)

WORK_BASES: Final = ("compute", "items", "requests")
FILL_MODES: Final = ("run", "spread", "inflight")
ROUTING_POLICIES: Final = ("fill_least", "fill_rr")
ALL_REPLICAS: Final = "all"


class PolicyError(ValueError):
    """A knob name or value the policy refuses; the message says which and what is accepted."""


@attrs.frozen
class ModelOverride:
    """Per-model overrides of the fleet-wide replicas, fill mode and fill factor (None = the default)."""

    replicas: int | str | None = None
    fill_mode: str | None = None
    fill_factor: float | None = None


@attrs.frozen
class PlacementPolicy:
    """Seed 002's `scheduling:` block. `default_replicas` and `ModelOverride.replicas` are a positive int or
    `all`. `ema_halflife_compute_seconds` 0 tracks `rebalance_compute_seconds`; `first_rebalance_compute_seconds`
    0 uses `rebalance_compute_seconds` for the first repack too."""

    mode: str = ROUND_ROBIN
    work_basis: str = "compute"
    rebalance_compute_seconds: float = 300.0
    first_rebalance_compute_seconds: float = 60.0
    ema_halflife_compute_seconds: float = 0.0
    hysteresis: float = 0.0
    default_replicas: int | str = 1
    routing_fill_factor: float = 1.0
    routing_policy: str = "fill_least"
    routing_fill_mode: str = "run"
    forbid_memory_oversubscription: bool = True
    models: Mapping[str, ModelOverride] = attrs.field(factory=dict)
