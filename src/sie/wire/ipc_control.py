"""IPC method bodies for worker control: health, model readiness, capabilities, live config and drain.

Field names and defaults follow contracts Part A §2.1; a field with no listed default is required
unless it is nullable, in which case it defaults to None. Batch bodies live in ipc_batch.py.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from sie.wire._fields import omittable

MODEL_STATE_READY: Final = "ready"
MODEL_STATE_LOADING_STARTED: Final = "loading_started"
MODEL_STATE_LOADING_IN_PROGRESS: Final = "loading_in_progress"
MODEL_STATE_RETRY_LATER: Final = "retry_later"
MODEL_STATE_FAILED: Final = "failed"


@attrs.frozen(kw_only=True)
class PingRequest:
    """Heartbeat from the sidecar."""

    timestamp_ms: float


@attrs.frozen(kw_only=True)
class ModelResidency:
    """Our addition: one model loaded on one worker child, where and in what precision it runs. `precision` is
    float32 or float16 for a graph this project converted, None for an ONNX file shipped with the model (it runs as
    it was exported)."""

    model_id: str
    worker: str
    device: str
    precision: str | None = None


@attrs.frozen(kw_only=True)
class PingResponse:
    """Worker liveness: `ready` is readiness and device health; the hash is "" without a bundle."""

    timestamp_ms: float
    worker_id: str
    ready: bool = False
    bundle_config_hash: str = ""
    loaded_models: list[str] = attrs.Factory(list)
    loading_models: list[str] = attrs.Factory(list)
    # Our addition (readers of the public contract ignore it): the GPUs behind this answer, for heartbeats.
    device_count: int | None = omittable()
    # Our addition: where each loaded model runs and in what precision, for heartbeats and `/v1/models`.
    residency: list[ModelResidency] | None = omittable()


@attrs.frozen(kw_only=True)
class EnsureModelReadyRequest:
    """Ask the worker to have a model loaded (or start loading it). Our addition, `pin`: True keeps the model loaded
    until released (a pool's `pinned_models`, seed 000 §16.3: never evicted for another), False releases it (and
    starts no load); absent, as in the public contract, the model is loaded like any other."""

    model_id: str
    pin: bool | None = omittable()


@attrs.frozen(kw_only=True)
class ModelDescriptor:
    """What the sidecar needs to prepare work for a ready model; `tokenizer_id` is BLAKE3 of tokenizer.json."""

    tokenizer_path: str | None = None
    tokenizer_id: str | None = None
    max_seq_len: int | None = None
    output_types: list[str] = attrs.Factory(list)
    supports_run_batch: bool = False
    default_query_template: str | None = None
    default_doc_template: str | None = None
    max_concurrent_dispatch: int | None = None
    # Our addition: the profile's token budget per batch, for the sidecar's batch former.
    max_batch_tokens: int | None = omittable()
    # Our additions for image models: the image processor's settings (preprocessor_config.json), with which the
    # sidecar turns each item's images into pixel values, and what one image costs in the batch budget (its patches).
    image_processor: dict[str, Any] | None = omittable()
    image_cost: int | None = omittable()


@attrs.frozen(kw_only=True)
class EnsureModelReadyResponse:
    """A `MODEL_STATE_*` value; `batch_budget` and `descriptor` are set only when the state is ready."""

    state: str
    batch_budget: int | None = None
    descriptor: ModelDescriptor | None = None
    # Our additions (readers of the public contract ignore them): why a load failed, for the
    # MODEL_LOAD_FAILED / retry answers the gateway gives without asking the worker again.
    error: str | None = omittable()
    error_class: str | None = omittable()
    attempts: int | None = omittable()
    retry_after_s: float | None = omittable()


@attrs.frozen(kw_only=True)
class WorkerCapabilitiesRequest:
    """An empty body."""


@attrs.frozen(kw_only=True)
class WorkerCapabilitiesResponse:
    """Optional protocol features and the models this worker can serve."""

    supports_execution_authority_v1: bool
    supports_numerical_admission_v1: bool
    has_generation_models: bool
    generation_models: list[str]
    supported_models: list[str]
    loaded_models: list[str]


@attrs.frozen(kw_only=True)
class ApplyModelConfigRequest:
    """One config delta forwarded to the worker; `model_config` is the merged model YAML."""

    bundle_id: str
    model_id: str
    epoch: int
    bundle_config_hash: str
    model_config: str
    profiles_added: list[str] = attrs.Factory(list)
    bundle_adapters: list[str] | None = None


@attrs.frozen(kw_only=True)
class ApplyModelConfigResponse:
    """The hash the worker computed after applying; the sidecar trusts it only if it matches."""

    applied: bool
    bundle_config_hash: str
    config_version: int = 0
    unsupported_models: list[str] = attrs.Factory(list)


@attrs.frozen(kw_only=True)
class ModelConfigEntry:
    """One model of a full replacement: its id and merged YAML."""

    model_id: str
    model_config: str


@attrs.frozen(kw_only=True)
class ReplaceModelConfigsRequest:
    """A full export for the worker's bundle, replacing its model configs."""

    bundle_id: str
    epoch: int
    bundle_config_hash: str
    models: list[ModelConfigEntry]
    bundle_adapters: list[str] | None = None


@attrs.frozen(kw_only=True)
class ReplaceModelConfigsResponse:
    """What a full replacement changed."""

    applied: bool
    bundle_config_hash: str
    config_version: int
    applied_models: list[str]
    applied_profiles: list[str]
    unsupported_models: list[str]


@attrs.frozen(kw_only=True)
class SetPinnedModelsRequest:
    """Models the worker must keep loaded."""

    models: list[str]


@attrs.frozen(kw_only=True)
class SetPinnedModelsResponse:
    """How many models are now pinned."""

    applied: bool
    pinned_count: int


@attrs.frozen(kw_only=True)
class UnloadModelRequest:
    """Our addition: drop a loaded model from this worker because placement moved its replicas elsewhere (seed 002
    compaction). A pool's pin on it here ends too; a model preloaded by SIE_PRELOAD_MODELS stays loaded."""

    model_id: str


@attrs.frozen(kw_only=True)
class UnloadModelResponse:
    """Whether the model was unloaded, and the bytes that freed; `reason` says why not (not loaded, preloaded,
    generating)."""

    unloaded: bool
    memory_freed_bytes: int = 0
    reason: str = ""


@attrs.frozen(kw_only=True)
class DrainRequest:
    """Stop accepting batches; a deadline can only tighten an earlier one (a bool is rejected)."""

    deadline_ms: float | None = None


@attrs.frozen(kw_only=True)
class DrainResponse:
    """Drain accepted."""

    acknowledged: bool = True


@attrs.frozen(kw_only=True)
class SignalGenerateCancelRequest:
    """Cancel the generation started by `request_id`."""

    request_id: str


@attrs.frozen(kw_only=True)
class SignalGenerateCancelResponse:
    """Whether a running generation matched."""

    matched: bool


@attrs.frozen(kw_only=True)
class ModelControlStatusRequest:
    """An empty body."""


@attrs.frozen(kw_only=True)
class ModelControlEntry:
    """One model a worker has loaded, is loading or failed to load, with what its batches cost there.

    `state` is MODEL_STATE_READY, MODEL_STATE_LOADING_IN_PROGRESS or MODEL_STATE_FAILED; `memory_bytes` its
    resident weight bytes; `cost_per_item_s` the measured compute seconds per item (an average over batches,
    None until it ran); `max_batch_items` the batch budget the worker gives it (0 or 1: unbatched);
    `compute_seconds` the device-seconds of its batches so far.
    """

    model_id: str
    state: str
    memory_bytes: int = 0
    cost_per_item_s: float | None = None
    max_batch_items: int = 0
    batched: bool = True
    batches: int = 0
    items: int = 0
    compute_seconds: float = 0.0


@attrs.frozen(kw_only=True)
class ModelControlStatusResponse:
    """Our addition: one worker child's device, readiness, memory and measured compute, which the sidecar's
    placement polls each probe round (seed 002); `models` holds loaded, loading and failed models only."""

    worker_id: str
    device: str
    ready: bool
    memory_budget_bytes: int | None = None
    memory_used_bytes: int = 0
    compute_seconds_total: float = 0.0
    models: list[ModelControlEntry] = attrs.Factory(list)


@attrs.frozen(kw_only=True)
class WorkerMetricsRequest:
    """An empty body."""


@attrs.frozen(kw_only=True)
class WorkerMetricsResponse:
    """Our addition: the worker process's metrics in Prometheus text exposition format (empty when metrics are
    off), which the sidecar serves on its `/metrics` labelled with the child's name and device."""

    text: str = ""
