"""A PlacementControl double and a fixed snapshot, for the tests of the placement control surface (the surface
is the subject there, so the control behind it is a fake: it records calls and refuses what the policy would)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import attrs

from sie.placement.policy import FILL_MODES, LPT_PACKING, ModelOverride, PlacementPolicy, PolicyError
from sie.placement.snapshot import (
    BatchSizes,
    ChildState,
    ModelPlacement,
    PlacementSnapshot,
    RepackRecord,
    ReplicaState,
)

BGE = "BAAI/bge-m3"
MINI = "sentence-transformers/all-MiniLM-L6-v2"

RECORD = RepackRecord(
    at=1_700_000_000.0,
    trigger="manual",
    models_placed=2,
    moved=(BGE,),
    held_by_hysteresis=(MINI,),
    compute_seconds=12.5,
    wall_seconds=3.0,
)


def sample_snapshot(policy: PlacementPolicy) -> PlacementSnapshot:
    """Three children: worker-0 hosts both models, worker-1 hosts BGE, worker-2 (not ready) hosts nothing."""
    children = (
        ChildState("worker-0", "cuda:0", True, (BGE, MINI), 2, 48, 0.75, 80_000_000_000, 120.5),
        ChildState("worker-1", "cuda:1", True, (BGE,), 1, 16, 0.25, 80_000_000_000, 99.0),
        ChildState("worker-2", "cuda:2", False, (), 0, 0, 0.0, None, 0.0),
    )
    models = (
        ModelPlacement(
            BGE,
            2,
            "run",
            1.0,
            32,
            0.6,
            (
                ReplicaState("worker-0", "cuda:0", 0.5, 32, 10, 300),
                ReplicaState("worker-1", "cuda:1", 0.5, 16, 8, 250),
            ),
        ),
        ModelPlacement(MINI, "all", "spread", 0.5, 64, 0.1, (ReplicaState("worker-0", "cuda:0", 1.0, 16, 4, 64),)),
    )
    batch_sizes = (
        BatchSizes("worker-0", "cuda:0", BGE, ((1.0, 2), (8.0, 6), (32.0, 10), (float("inf"), 10)), 10, 120),
    )
    return PlacementSnapshot(policy, children, models, (("startup", 1), ("compute", 2)), RECORD, batch_sizes)


class FakeControl:
    """Keeps a policy, validates like the real one would (a subset) and records every repack wait."""

    def __init__(self, policy: PlacementPolicy | None = None) -> None:
        self.policy = policy or PlacementPolicy(mode=LPT_PACKING, work_basis="items")
        self.waits: list[float] = []
        self.repack_gate: asyncio.Event | None = None  # set by a test to hold repacks until it opens

    def snapshot(self) -> PlacementSnapshot:
        return sample_snapshot(self.policy)

    def set_model(
        self,
        model_id: str,
        replicas: int | str | None = None,
        fill_mode: str | None = None,
        fill_factor: float | None = None,
    ) -> ModelOverride:
        if isinstance(replicas, int) and replicas < 1 or isinstance(replicas, str) and replicas != "all":
            raise PolicyError(f"replicas {replicas!r} is not a whole number >= 1 or 'all'")
        if fill_mode is not None and fill_mode not in FILL_MODES:
            raise PolicyError(f"fill_mode {fill_mode!r} is not one of {FILL_MODES}")
        override = ModelOverride(replicas, fill_mode, fill_factor)
        self.policy = attrs.evolve(self.policy, models={**self.policy.models, model_id: override})
        return override

    def set_policy(self, knobs: Mapping[str, object]) -> PlacementPolicy:
        settable = set(attrs.fields_dict(PlacementPolicy)) - {"mode", "models"}
        unknown = sorted(set(knobs) - settable)
        if unknown:
            raise PolicyError(f"unknown or fixed knob(s) {unknown}")
        self.policy = attrs.evolve(self.policy, **knobs)
        return self.policy

    async def repack(self, wait_s: float) -> RepackRecord | None:
        self.waits.append(wait_s)
        if self.repack_gate is not None:
            await self.repack_gate.wait()
        return RECORD if self.policy.mode == LPT_PACKING else None
