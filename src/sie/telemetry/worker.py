"""A worker's series (seed 001): model loads (count, duration, outcome), evictions, and at each collection the
models it holds and the memory they take, read from the model manager.

A worker process records into its own `Telemetry`; the sidecar (or the `all` role) fetches that text over the
`WorkerMetrics` IPC call and serves it on its `/metrics` with `worker` and `device` labels
(`sie.telemetry.exposition`). Model labels are the worker's catalogue ids.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from sie.telemetry.metrics import ModelLabels, Tally, Telemetry

# Loads take from a second (a cached ONNX graph) to minutes (a download and a conversion).
LOAD_BUCKETS_S: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class LoadOutcome(enum.StrEnum):
    LOADED = "loaded"
    FAILED = "failed"


class ModelHolder(Protocol):
    """What the gauges read: the model manager's public state (cheap, on the event loop's thread)."""

    @property
    def loaded_models(self) -> list[str]: ...

    @property
    def loading_models(self) -> list[str]: ...

    @property
    def memory_bytes(self) -> int: ...

    @property
    def memory_budget_bytes(self) -> int | None: ...

    def model_memory_bytes(self, model_id: str) -> int: ...

    def generation_sequences(self) -> dict[str, tuple[int, int]]: ...


class WorkerMetrics:
    """Model load events, recorded by the manager; model and memory gauges, read from `watch(holder)`; `text()`
    is the worker process's whole exposition, which the `WorkerMetrics` IPC call answers."""

    def __init__(self, telemetry: Telemetry, models: ModelLabels | None = None) -> None:
        self._telemetry = telemetry
        self._meter = meter = telemetry.meter
        self._models = models if models is not None else ModelLabels()
        # Loads by result: failures per model, and how often a model comes back after an eviction (thrashing).
        self._loads = Tally(meter, "sie.worker.model.loads", "{load}", "Model loads by outcome.", ("model", "outcome"))
        # What a cold start costs: the wait a first request (or a scale-up) sees.
        self._load_duration = meter.create_histogram(
            "sie.worker.model.load.duration",
            unit="s",
            description="Time to load a model, successful or not.",
            explicit_bucket_boundaries_advisory=LOAD_BUCKETS_S,
        )
        # Models pushed out by the memory budget or the loaded-model cap (SIE_MAX_LOADED_MODELS).
        self._evictions = Tally(meter, "sie.worker.model.evictions", "{eviction}", "Models unloaded.", ("model",))

    def text(self) -> str:
        return self._telemetry.prometheus_text().decode()

    def load_finished(self, model_id: str, outcome: LoadOutcome, seconds: float) -> None:
        model = self._models(model_id)
        self._loads.add((model, outcome.value))
        self._load_duration.record(seconds, {"model": model, "outcome": outcome.value})

    def evicted(self, model_id: str) -> None:
        self._evictions.add((self._models(model_id),))

    def watch(self, holder: ModelHolder) -> None:
        """Report `holder`'s models and memory at each collection."""
        models = self._models

        def states(options: CallbackOptions) -> Iterable[Observation]:
            loaded = [Observation(1, {"model": models(m), "state": "loaded"}) for m in holder.loaded_models]
            return loaded + [Observation(1, {"model": models(m), "state": "loading"}) for m in holder.loading_models]

        def memory(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(holder.model_memory_bytes(m), {"model": models(m)}) for m in holder.loaded_models]

        def sequences(options: CallbackOptions) -> Iterable[Observation]:
            observations = []
            for model_id, (decoding, waiting) in holder.generation_sequences().items():
                observations.append(Observation(decoding, {"model": models(model_id), "state": "decoding"}))
                observations.append(Observation(waiting, {"model": models(model_id), "state": "waiting"}))
            return observations

        def totals(options: CallbackOptions) -> Iterable[Observation]:
            used = [Observation(holder.memory_bytes, {"kind": "used"})]
            budget = holder.memory_budget_bytes
            return used if budget is None else [*used, Observation(budget, {"kind": "budget"})]

        # Which models are resident or loading where: 1 per (model, state).
        self._meter.create_observable_gauge(
            "sie.worker.model.state", callbacks=[states], unit="1", description="1 per model loaded or loading."
        )
        self._meter.create_observable_gauge(
            "sie.worker.models.loaded",
            callbacks=[lambda options: [Observation(len(holder.loaded_models))]],
            unit="{model}",
            description="Models loaded.",
        )
        # Memory per model and against the budget (SIE_WORKER_MEMORY_BUDGET_BYTES): the eviction pressure.
        self._meter.create_observable_gauge(
            "sie.worker.model.memory", callbacks=[memory], unit="By", description="Memory each loaded model holds."
        )
        self._meter.create_observable_gauge(
            "sie.worker.memory", callbacks=[totals], unit="By", description="Model memory used, and the budget."
        )
        # Generations per model: decoding together (continuous batching) and waiting for a row
        # (SIE_GENERATION_MAX_SEQUENCES); a cancelled stream leaves at the next decode step.
        self._meter.create_observable_gauge(
            "sie.worker.generation.sequences",
            callbacks=[sequences],
            unit="{sequence}",
            description="Generations decoding or waiting, per model.",
        )
