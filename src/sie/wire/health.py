"""Worker heartbeats on `sie.health.{worker_id}` (seed 001 "Readiness, Health, And Telemetry"): identity,
lane, readiness, the advertised bundle_config_hash and model residency, JSON on the bus.
"""

from __future__ import annotations

import attrs

from sie.wire._fields import omittable
from sie.wire.ipc_control import ModelResidency


@attrs.frozen(kw_only=True)
class ModelFailure:
    """A model this worker failed to load, as `/v1/models` shows it in `last_error`."""

    error_class: str
    message: str
    attempts: int = 1
    permanent: bool = True


@attrs.frozen(kw_only=True)
class WorkerHeartbeat:
    """One worker's state; the gateway treats a worker as gone when heartbeats stop."""

    worker_id: str
    pool: str
    machine_profile: str
    bundle: str
    ready: bool
    timestamp: float
    bundle_config_hash: str = ""
    loaded_models: list[str] = attrs.Factory(list)
    loading_models: list[str] = attrs.Factory(list)
    failed_models: dict[str, ModelFailure] = attrs.Factory(dict)
    draining: bool = False
    interval_s: float = 1.0
    device_count: int | None = omittable()
    # Where each loaded model runs and in what precision (`/v1/models` `loaded_on`); absent from older workers.
    residency: list[ModelResidency] | None = omittable()
