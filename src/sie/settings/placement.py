"""Placement of batches on a pod's worker children (seed 002 "Scheduling modes"; DESIGN §3 `placement/`).

Read by the sidecar (its fleet of worker children) and by `--role all` (its in-process children). Every knob
except the mode can also be changed while running, through `POST /v1/placement/policy`.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sie.settings._parsers import Parser, boolean, choice, integer, number, path, seconds
from sie.settings._spec import Env, setting

_ROLES = ("sidecar", "all")
_POLICY = ("sie.placement.policy",)


def replica_count() -> Parser:
    """A positive whole number of replicas, or `all` (every ready child)."""

    def convert(raw: str) -> int | str:
        if raw.lower() == "all":
            return "all"
        try:
            value = int(raw, 10)
        except ValueError:
            raise ValueError("is not a replica count; expected a whole number >= 1 or 'all'") from None
        if value < 1:
            raise ValueError("is out of range; expected a whole number >= 1 or 'all'")
        return value

    return Parser("integer >= 1 | all", convert)


@attrs.frozen
class PlacementSettings:
    """The `scheduling:` block of one pod's worker children (its knobs as variables), plus how often the children are
    probed."""

    mode: str = setting(
        Env(
            "SIE_PLACEMENT_MODE",
            choice("round_robin", "least_outstanding", "lpt_packing"),
            "How batches spread over the worker children: `round_robin` in turn, `least_outstanding` to the child "
            "with the least in-flight work, `lpt_packing` each model on its own replicas with a fill quantum.",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        "round_robin",
    )
    work_basis: str = setting(
        Env(
            "SIE_PLACEMENT_WORK_BASIS",
            choice("compute", "items", "requests"),
            'What "busy" counts for least_outstanding and fill_least: in-flight compute-seconds, items, or '
            "batches (per-request cost under fill_least).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        "compute",
    )
    rebalance_compute_seconds: float = setting(
        Env(
            "SIE_PLACEMENT_REBALANCE_COMPUTE_SECONDS",
            seconds(positive=True),
            "lpt_packing repacks after the children together consumed this many device-seconds.",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        300.0,
    )
    first_rebalance_compute_seconds: float = setting(
        Env(
            "SIE_PLACEMENT_FIRST_REBALANCE_COMPUTE_SECONDS",
            seconds(),
            "Device-seconds before the first repack (0: the same as SIE_PLACEMENT_REBALANCE_COMPUTE_SECONDS).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        60.0,
    )
    ema_halflife_compute_seconds: float = setting(
        Env(
            "SIE_PLACEMENT_EMA_HALFLIFE_COMPUTE_SECONDS",
            seconds(),
            "Halflife of the demand average in fleet device-seconds (0: one rebalance interval).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        0.0,
    )
    hysteresis: float = setting(
        Env(
            "SIE_PLACEMENT_HYSTERESIS",
            number(),
            "Extra pressure improvement a single-replica model needs before a repack moves it (0: any gain).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        0.0,
    )
    default_replicas: int | str = setting(
        Env(
            "SIE_PLACEMENT_DEFAULT_REPLICAS",
            replica_count(),
            "lpt_packing: children per model unless the placement file overrides it (a number or `all`).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        1,
    )
    fill_factor: float = setting(
        Env(
            "SIE_PLACEMENT_FILL_FACTOR",
            number(positive=True),
            "lpt_packing: the fill quantum as a multiple of the model's max batch (in items).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        1.0,
    )
    routing_policy: str = setting(
        Env(
            "SIE_PLACEMENT_ROUTING_POLICY",
            choice("fill_least", "fill_rr"),
            "lpt_packing: where a run opens: the least busy replica (`fill_least`) or the next in turn (`fill_rr`).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        "fill_least",
    )
    fill_mode: str = setting(
        Env(
            "SIE_PLACEMENT_FILL_MODE",
            choice("run", "spread", "inflight"),
            "lpt_packing: what the quantum counts: items routed in the current run (`run`), in-flight items "
            "evened over the replicas (`spread`), or batches in flight on the current replica (`inflight`).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        "run",
    )
    forbid_memory_oversubscription: bool = setting(
        Env(
            "SIE_PLACEMENT_FORBID_MEMORY_OVERSUBSCRIPTION",
            boolean(),
            "lpt_packing: place a model only where its weights fit, whenever some child can hold it.",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        True,
    )
    compaction_mode: str = setting(
        Env(
            "SIE_PLACEMENT_COMPACTION_MODE",
            choice("eager", "scheduled", "off"),
            "lpt_packing: after a repack, unload each model from the children that no longer hold a replica of it "
            "(`eager`: as soon as its new replicas are ready and its last batch there ended; `scheduled`: only while "
            "that child has no batch in flight) or never (`off`: the worker's LRU frees memory when it must).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        "eager",
    )
    compaction_interval: int = setting(
        Env(
            "SIE_PLACEMENT_COMPACTION_INTERVAL",
            integer(minimum=0),
            "lpt_packing: repacks between compactions (1: after every repack; 0: never compact).",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        1,
    )
    file: Path | None = setting(
        Env(
            "SIE_PLACEMENT_FILE",
            path(),
            "YAML with a `scheduling:` block: any knob above plus `models: {MODEL: {replicas, "
            "fill_mode, fill_factor}}`; a variable set to other than its default overrides the file's knob.",
            roles=_ROLES,
            read_by=_POLICY,
        ),
        None,
    )
    probe_interval_s: float = setting(
        Env(
            "SIE_PLACEMENT_PROBE_INTERVAL_S",
            seconds(positive=True),
            "How often each worker child is probed (readiness, loaded models, cost per item, memory); a probe "
            "that takes longer than this drops and recreates that child's connection.",
            roles=_ROLES,
            read_by=("sie.sidecar.pod.fleet",),
        ),
        2.0,
    )
