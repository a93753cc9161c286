"""Where the gateway learns model and worker state for `/v1/models` and `/health`: the ModelStatusSource seam.

`--role all` implements it over the worker's model manager, the distributed gateway over heartbeats.
Nothing here is on the inference path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

import attrs

from sie.wire.ipc_control import ModelResidency

# ModelInfo.state values (contracts Part B §1.6).
STATE_AVAILABLE: Final = "available"
STATE_LOADING: Final = "loading"
STATE_LOADED: Final = "loaded"
STATE_UNLOADING: Final = "unloading"
STATE_FAILED: Final = "failed"


@attrs.frozen
class LastError:
    """The recorded load failure of a model: `code` is GATED, NOT_FOUND, OOM, NETWORK, DEPENDENCY or UNKNOWN."""

    code: str
    message: str
    attempts: int = 1
    permanent: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "attempts": self.attempts, "permanent": self.permanent}


@attrs.frozen
class WorkerSummary:
    """One worker as `/health` lists it."""

    name: str
    pool: str
    machine_profile: str
    bundle: str
    healthy: bool = True
    gpu_count: int = 0
    loaded_models: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pool_name": self.pool,
            "machine_profile": self.machine_profile,
            "bundle": self.bundle,
            "healthy": self.healthy,
            "gpu_count": self.gpu_count,
            "loaded_models": list(self.loaded_models),
        }


class ModelStatusSource(Protocol):
    """Model and worker state as the workers last reported it; calls must be cheap and never block."""

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        """`(state, last_error)` of a catalogue id (a base model or a `model:profile` variant)."""
        ...

    def workers(self) -> Sequence[WorkerSummary]:
        """The workers currently known to be alive."""
        ...

    def residency(self, model_id: str) -> Sequence[ModelResidency]:
        """Where the model is loaded now: each worker (child) with its device and the graph's precision."""
        ...
