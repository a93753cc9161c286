"""How a multi-device worker pod picks the child for each batch (seed 002 "Scheduling modes").

These are the start-up values; the runtime scheduling control may change every knob except `mode`.
"""

from __future__ import annotations

import attrs

from sie.settings._parsers import boolean, choice, number, replica_count, seconds
from sie.settings._spec import Env, setting


@attrs.frozen
class PlacementSettings:
    """Placement mode and the lpt_packing knobs (fill quantum, repacking, demand EMA, hysteresis)."""

    mode: str = setting(
        Env(
            "SIE_PLACEMENT_MODE",
            choice("round_robin", "least_outstanding", "lpt_packing"),
            "How batches are spread over a model's replicas; fixed for the process lifetime.",
        ),
        "round_robin",
    )
    work_basis: str = setting(
        Env(
            "SIE_PLACEMENT_WORK_BASIS",
            choice("compute", "items", "requests"),
            "What 'least busy' counts, for least_outstanding and fill_least.",
        ),
        "compute",
    )
    routing_policy: str = setting(
        Env(
            "SIE_PLACEMENT_ROUTING_POLICY",
            choice("fill_least", "fill_rr"),
            "lpt_packing: the replica each run opens on (least-loaded, or rotating).",
        ),
        "fill_least",
    )
    fill_mode: str = setting(
        Env(
            "SIE_PLACEMENT_FILL_MODE",
            choice("run", "spread", "inflight"),
            "lpt_packing: what the fill quantum counts (items per run; even in-flight items; requests).",
        ),
        "run",
    )
    fill_factor: float = setting(
        Env(
            "SIE_PLACEMENT_FILL_FACTOR",
            number(positive=True),
            "lpt_packing: fill quantum as a multiple of the model's max batch size.",
        ),
        1.0,
    )
    default_replicas: int | str = setting(
        Env(
            "SIE_PLACEMENT_DEFAULT_REPLICAS",
            replica_count(),
            "lpt_packing: devices each model is placed on (`all`: every ready child).",
        ),
        1,
    )
    rebalance_compute_s: float = setting(
        Env(
            "SIE_PLACEMENT_REBALANCE_COMPUTE_S",
            seconds(positive=True),
            "lpt_packing: device-seconds of work consumed between repacks.",
        ),
        300.0,
    )
    first_rebalance_compute_s: float = setting(
        Env(
            "SIE_PLACEMENT_FIRST_REBALANCE_COMPUTE_S",
            seconds(),
            "lpt_packing: budget of the first repack (0: same as the steady-state budget).",
        ),
        60.0,
    )
    ema_halflife_compute_s: float = setting(
        Env(
            "SIE_PLACEMENT_EMA_HALFLIFE_COMPUTE_S",
            seconds(),
            "lpt_packing: demand EMA halflife in device-seconds (0: one rebalance budget).",
        ),
        0.0,
    )
    hysteresis: float = setting(
        Env(
            "SIE_PLACEMENT_HYSTERESIS",
            number(0),
            "lpt_packing: improvement a move must exceed before a model changes device (0: any gain).",
        ),
        0.0,
    )
    forbid_memory_oversubscription: bool = setting(
        Env(
            "SIE_PLACEMENT_FORBID_MEMORY_OVERSUBSCRIPTION",
            boolean(),
            "lpt_packing: place a model only where its weights fit whenever some child can hold it.",
        ),
        True,
    )
