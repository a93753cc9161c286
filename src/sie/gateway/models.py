"""Operator read surface bodies: ModelInfo for `/v1/models` (contracts Part B §1.6, seed 000 §14) and the
gateway `/health` summary (contracts Part B §1.10). Built from a catalog snapshot and a ModelStatusSource. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sie.catalog import Catalog, ModelConfig, ModelEntry
from sie.catalog.errors import ConfigError
from sie.gateway.status import STATE_LOADED, ModelStatusSource, WorkerSummary

INPUT_KINDS: Final = ("text", "image", "audio", "video", "document")


# Per model id, the pools that pin it (`sie.gateway.pools.PoolDirectory.pinning_pools`).
PinningPools = Mapping[str, Sequence[str]]


def model_info(
    catalog: Catalog, entry: ModelEntry, status: ModelStatusSource, pinning: PinningPools | None = None
) -> dict[str, Any]:
    """One ModelInfo: catalogue facts plus the state the workers report and the pools that pin it; a model that
    generates text also names its `tasks` and its `capabilities` (the SDK's ModelCapabilities: `streaming`, ...)."""
    model = entry.model
    state, last_error = status.status(entry.model_id)
    info = {
        "name": entry.model_id,
        "inputs": [kind for kind in INPUT_KINDS if model.inputs.get(kind)],
        "outputs": model.outputs,
        "dims": model.dims,
        "loaded": state == STATE_LOADED,
        "state": state,
        "last_error": last_error.to_dict() if last_error is not None else None,
        "max_sequence_length": model.max_sequence_length,
        "profiles": {name: {"is_default": name == entry.profile} for name in model.profiles},
        "bundles": [bundle.name for bundle in catalog.entry_bundles(entry)],
        # Our additions: the precision the profile asks for (null: the device's default), and where the model is
        # loaded now with the precision its graph runs in there (float32 on CPU; null for a shipped ONNX file).
        "compute_precision": _compute_precision(entry),
        "loaded_on": [
            {"worker": where.worker, "device": where.device, "precision": where.precision}
            for where in status.residency(entry.model_id)
        ],
        # Our addition: the pools whose `pinned_models` keep it loaded on their workers.
        "pinned_by": list((pinning or {}).get(entry.model_id, ())),
    }
    if model.tasks.generate:
        info["tasks"] = _tasks(model)
        info["capabilities"] = _generate_capabilities(model)
    return info


def _compute_precision(entry: ModelEntry) -> str | None:
    try:
        return entry.model.resolve_profile(entry.profile).compute_precision
    except ConfigError:  # a profile that does not resolve fails its load, which says why
        return None


def _tasks(model: ModelConfig) -> list[str]:
    tasks = model.tasks
    flags = {"encode": bool(tasks.encode), "score": tasks.score, "extract": tasks.extract, "generate": tasks.generate}
    return [name for name, served in flags.items() if served]


def _generate_capabilities(model: ModelConfig) -> dict[str, Any]:
    """`tasks.generate.capabilities` as the model YAML declares it, `streaming` true unless it says otherwise."""
    generate = (model.raw.get("tasks") or {}).get("generate")
    declared = generate.get("capabilities") if isinstance(generate, dict) else None
    return {"streaming": True, **(declared if isinstance(declared, dict) else {})}


def models_body(catalog: Catalog, status: ModelStatusSource, pinning: PinningPools | None = None) -> dict[str, Any]:
    """`{"models": [ModelInfo]}` for every servable id, profile variants included; `unservable` lists the model files
    (or profiles) the catalogue left out, each with its reason, when there are any."""
    infos = [model_info(catalog, entry, status, pinning) for entry in catalog.entries.values()]
    body: dict[str, Any] = {"models": infos}
    if catalog.problems:
        body["unservable"] = [
            {"model_id": problem.model_id, "source": problem.source or None, "reason": problem.describe()}
            for problem in catalog.problems
        ]
    return body


def model_body(
    catalog: Catalog, model_id: str, status: ModelStatusSource, pinning: PinningPools | None = None
) -> dict[str, Any]:
    """One model's ModelInfo; an unknown id raises ModelNotFoundError."""
    return model_info(catalog, catalog.get(model_id), status, pinning)


def health_body(
    catalog: Catalog, status: ModelStatusSource, configured_gpus: Sequence[str], routing_reason: str | None = None
) -> dict[str, Any]:
    """Gateway health: `type: "gateway"` (how the SDK tells a gateway from a worker), whether requests can be
    routed now (`routing`: the broker connected and the first round of worker heartbeats over; else why not),
    workers and models."""
    workers = list(status.workers())
    loaded = {model for worker in workers for model in worker.loaded_models}
    healthy = routing_reason is None and any(worker.healthy for worker in workers)
    return {
        "status": "healthy" if healthy else "degraded",
        "type": "gateway",
        "routing": {"ready": routing_reason is None, "reason": routing_reason},
        "configured_gpu_types": list(configured_gpus),
        "live_gpu_types": sorted({worker.machine_profile for worker in workers}),
        "cluster": _cluster(workers, loaded),
        "workers": [worker.to_dict() for worker in workers],
        "models": [_model_summary(entry, status, workers) for entry in catalog.entries.values()],
    }


def _cluster(workers: Sequence[WorkerSummary], loaded: set[str]) -> dict[str, Any]:
    return {
        "worker_count": len(workers),
        "gpu_count": sum(worker.gpu_count for worker in workers),
        "models_loaded": len(loaded),
        "total_qps": 0.0,
    }


def _model_summary(entry: ModelEntry, status: ModelStatusSource, workers: Sequence[WorkerSummary]) -> dict[str, Any]:
    state, _ = status.status(entry.model_id)
    count = sum(1 for worker in workers if entry.model_id in worker.loaded_models)
    return {"name": entry.model_id, "state": state, "worker_count": count}
