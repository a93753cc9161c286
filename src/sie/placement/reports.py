"""What the fleet tells placement each probe round: one report per worker child (device, readiness, memory,
consumed compute) and, inside it, one report per model the child knows (loaded, resident bytes, measured
cost per item, max batch, batch axis). Plain immutable values; the fleet swaps a whole new set in at once.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class ModelReport:
    """One model as one child reports it.

    `cost_per_item_s` is the worker-measured compute seconds per item (per request when `batched` is false);
    None until the child has run it. `max_batch_items` of 0 or 1, or `batched` false, means the model is
    counted one unit per request. `memory_bytes` is its resident weight footprint (0 when unknown).
    """

    model_id: str
    loaded: bool
    memory_bytes: int = 0
    cost_per_item_s: float | None = None
    max_batch_items: int = 1
    batched: bool = True


@attrs.frozen
class ChildReport:
    """One worker child (one device) at one probe round.

    `name` is stable across restarts (`worker-0`); `device` is `cpu` or `cuda:N`. `compute_seconds_total` is
    the device-seconds the child has spent running batches since it started (it restarts from 0 when the
    child process does). `memory_budget_bytes` is None when the child has no budget.
    """

    name: str
    device: str
    ready: bool
    compute_seconds_total: float = 0.0
    memory_budget_bytes: int | None = None
    models: Mapping[str, ModelReport] = attrs.field(factory=dict)
