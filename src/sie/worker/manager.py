"""Model lifecycle on one worker: lazy background loads, classified failures with cooldowns, and LRU
eviction under a memory budget and a loaded-model cap. Pinned models are never evicted.

`ensure_ready` never blocks: it answers with the model's readiness and, when needed, starts one
background load (contracts Part A §2.1 EnsureModelReady; Part B §5.2). Loads run in an executor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from enum import StrEnum

import attrs

from sie.catalog import Catalog, ModelConfig
from sie.telemetry.logs import log_fields
from sie.telemetry.worker import LoadOutcome, WorkerMetrics
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
)
from sie.worker.errors import LOAD_FAILURE_COOLDOWN_S, ModelLoadError
from sie.worker.loading import LoadedModel

logger = logging.getLogger(__name__)

LoadFunction = Callable[[ModelConfig, str, str], LoadedModel]


class ModelState(StrEnum):
    AVAILABLE = "available"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


@attrs.frozen
class LoadFailure:
    """The last failed load of a model: class, message, how many attempts so far, and when."""

    error_class: str
    message: str
    attempts: int
    failed_at: float

    @property
    def permanent(self) -> bool:
        return self.error_class not in LOAD_FAILURE_COOLDOWN_S

    def cooling_down(self, now: float) -> bool:
        return self.cooldown_left(now) > 0

    def cooldown_left(self, now: float) -> float:
        """Seconds until a transient failure may be retried (0 when it may be now)."""
        return max(0.0, LOAD_FAILURE_COOLDOWN_S.get(self.error_class, 0.0) - (now - self.failed_at))


@attrs.frozen
class ModelStatus:
    """What `/v1/models` shows for one servable id."""

    model_id: str
    state: ModelState
    last_error: LoadFailure | None = None
    memory_bytes: int = 0


class ModelManager:
    """Owns the loaded models of one worker. Use as an async context manager; call from one event loop."""

    def __init__(
        self,
        catalog: Catalog,
        load: LoadFunction,
        executor: Executor | None = None,
        memory_budget_bytes: int | None = None,
        max_loaded_models: int | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.catalog = catalog
        self._load = load
        self._executor = executor
        self._budget = memory_budget_bytes
        self._max_loaded = max_loaded_models
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._failures: dict[str, LoadFailure] = {}
        self._pinned: set[str] = set()  # the preloaded models (SIE_PRELOAD_MODELS)
        self._held: set[str] = set()  # the models pools pin on this worker while they do
        self.clock: Callable[[], float] = time.monotonic
        self.metrics = metrics
        if metrics is not None:
            metrics.watch(self)

    async def __aenter__(self) -> ModelManager:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for task in self._loading.values():
            task.cancel()
        await asyncio.gather(*self._loading.values(), return_exceptions=True)
        self._loading.clear()
        for loaded in self._loaded.values():
            loaded.close()

    def ensure_ready(self, model_id: str) -> str:
        """The model's EnsureModelReady state now (a `MODEL_STATE_*` value); starts a background load when it
        is neither loaded nor blocked."""
        entry = self.catalog.find(model_id)
        if entry is None:
            return MODEL_STATE_RETRY_LATER
        model_id = entry.model_id
        if model_id in self._loaded:
            self._loaded.move_to_end(model_id)
            return MODEL_STATE_READY
        if model_id in self._loading:
            return MODEL_STATE_LOADING_IN_PROGRESS
        failure = self._failures.get(model_id)
        if failure is not None and failure.permanent:
            return MODEL_STATE_FAILED
        if failure is not None and failure.cooling_down(self.clock()):
            return MODEL_STATE_RETRY_LATER
        self._loading[model_id] = asyncio.get_running_loop().create_task(self._run_load(model_id))
        return MODEL_STATE_LOADING_STARTED

    async def wait_ready(self, model_id: str) -> LoadedModel:
        """Start (or join) the load and wait for it; raises ModelLoadError when it fails."""
        readiness = self.ensure_ready(model_id)
        entry = self.catalog.get(model_id)
        if entry.model_id in self._loading:
            await asyncio.shield(self._loading[entry.model_id])
        loaded = self._loaded.get(entry.model_id)
        if loaded is None:
            failure = self._failures.get(entry.model_id)
            message = failure.message if failure else f"Model '{model_id}' is not ready ({readiness})"
            raise ModelLoadError(failure.error_class if failure else "UNKNOWN", message)
        return loaded

    def generation_sequences(self) -> dict[str, tuple[int, int]]:
        """Each loaded generation model's sequences: (decoding, waiting for a row)."""
        counts = {}
        for model_id, loaded in list(self._loaded.items()):
            sequences = loaded.adapter.generation_sequences()
            if sequences is not None:
                counts[model_id] = sequences
        return counts

    def get(self, model_id: str) -> LoadedModel | None:
        """The loaded model for an id (marking it recently used), or None."""
        entry = self.catalog.find(model_id)
        loaded = self._loaded.get(entry.model_id) if entry else None
        if loaded is not None:
            self._loaded.move_to_end(loaded.model_id)
        return loaded

    def failure(self, model_id: str) -> LoadFailure | None:
        entry = self.catalog.find(model_id)
        return self._failures.get(entry.model_id) if entry else None

    async def _run_load(self, model_id: str) -> None:
        entry = self.catalog.get(model_id)
        loop = asyncio.get_running_loop()
        logger.info("loading model %s", model_id, extra=log_fields(event="model_loading", model=model_id))
        started = time.perf_counter()
        outcome: LoadOutcome | None = None  # stays None when the load is cancelled (shutdown)
        try:
            loaded = await loop.run_in_executor(self._executor, self._load, entry.model, entry.profile, model_id)
            self._admit(loaded)
            outcome = LoadOutcome.LOADED
            _log_loaded(loaded, time.perf_counter() - started)
        except ModelLoadError as exc:
            outcome = LoadOutcome.FAILED
            self._record_failure(model_id, exc.error_class, exc.message)
        except Exception as exc:  # noqa: BLE001 - any other loader bug still becomes a visible failed state
            logger.exception("loading %s failed", model_id)
            # The caller sees the failure's kind only: runtime text can hold internal paths (the log has it whole).
            message = f"Model '{model_id}' failed to load ({type(exc).__name__}); the worker log has the details"
            outcome = LoadOutcome.FAILED
            self._record_failure(model_id, "UNKNOWN", message)
        finally:
            self._loading.pop(model_id, None)
            if self.metrics is not None and outcome is not None:
                self.metrics.load_finished(model_id, outcome, time.perf_counter() - started)

    def _record_failure(self, model_id: str, error_class: str, message: str) -> None:
        previous = self._failures.get(model_id)
        attempts = previous.attempts + 1 if previous else 1
        self._failures[model_id] = LoadFailure(error_class, message, attempts, self.clock())
        logger.warning("model %s failed to load (%s, attempt %d): %s", model_id, error_class, attempts, message,
                       extra=log_fields(event="model_failed", model=model_id, error_class=error_class,
                                        attempts=attempts))  # fmt: skip

    def _admit(self, loaded: LoadedModel) -> None:
        self._make_room(loaded.memory_bytes)
        if self._budget is not None and self.memory_bytes + loaded.memory_bytes > self._budget:
            raise ModelLoadError(
                "OOM",
                f"Model '{loaded.model_id}' needs {loaded.memory_bytes} bytes; the memory budget "
                f"SIE_WORKER_MEMORY_BUDGET_BYTES={self._budget} is held by pinned models",
            )
        self._failures.pop(loaded.model_id, None)
        self._loaded[loaded.model_id] = loaded

    def _make_room(self, needed: int) -> None:
        def over() -> bool:
            too_many = self._max_loaded is not None and len(self._loaded) >= self._max_loaded
            too_big = self._budget is not None and self.memory_bytes + needed > self._budget
            return too_many or too_big

        for model_id in list(self._loaded):  # least recently used first
            if not over():
                return
            if model_id not in self._pinned and model_id not in self._held:
                self.unload(model_id, "evicted to make room (least recently used)", "model_evicted")
                if self.metrics is not None:
                    self.metrics.evicted(model_id)

    @property
    def memory_bytes(self) -> int:
        return sum(model.memory_bytes for model in self._loaded.values())

    def model_memory_bytes(self, model_id: str) -> int:
        """The bytes one loaded model holds (0 when it is not loaded)."""
        loaded = self._loaded.get(model_id)
        return loaded.memory_bytes if loaded is not None else 0

    @property
    def memory_budget_bytes(self) -> int | None:
        """The bytes loaded models may hold (None: no budget)."""
        return self._budget

    def unload(self, model_id: str, why: str = "unloaded", event: str = "model_unloaded") -> bool:
        """Drop a loaded model; `why` and `event` say in its log line why (evicted, its config changed)."""
        removed = self._loaded.pop(model_id, None)
        if removed is not None:
            removed.close()
            logger.info("model %s %s: %d bytes freed, %d models (%d bytes) still loaded", model_id, why,
                        removed.memory_bytes, len(self._loaded), self.memory_bytes,
                        extra=log_fields(event=event, model=model_id, reason=why,
                                         bytes=removed.memory_bytes))  # fmt: skip
        return removed is not None

    def release(self, model_id: str, why: str) -> tuple[bool, str]:
        """Unload a model placement moved away from this worker: a pool's hold on it here ends; a preloaded model
        (SIE_PRELOAD_MODELS) stays. Whether it was unloaded, and why not when it was not."""
        entry = self.catalog.find(model_id)
        if entry is None or entry.model_id not in self._loaded:
            return False, "not loaded"
        self._held.discard(entry.model_id)
        if entry.model_id in self._pinned:
            return False, "preloaded (SIE_PRELOAD_MODELS)"
        return self.unload(entry.model_id, why, "model_compacted"), ""

    def pin(self, model_ids: Iterable[str]) -> None:
        """Replace the pinned set: these ids are never evicted."""
        self._pinned = {entry.model_id for m in model_ids if (entry := self.catalog.find(m))}

    def hold(self, model_id: str, keep: bool) -> None:
        """Keep `model_id` from eviction while a pool pins it (`keep`), or stop doing so; the preloaded stay pinned
        whatever the pools say. An id the catalogue does not know is ignored."""
        entry = self.catalog.find(model_id)
        if entry is None:
            return
        if keep:
            self._held.add(entry.model_id)
        else:
            self._held.discard(entry.model_id)

    @property
    def held(self) -> frozenset[str]:
        """The models pools pin here now."""
        return frozenset(self._held)

    def is_loaded(self, model_id: str) -> bool:
        entry = self.catalog.find(model_id)
        return entry is not None and entry.model_id in self._loaded

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap in a new catalogue; a model whose config changed forgets its failure and reloads on next use."""
        old, self.catalog = self.catalog, catalog
        for model_id in list(self._failures) + list(self._loaded):
            before, after = old.find(model_id), catalog.find(model_id)
            if after is None or before is None or before.model != after.model:
                self._failures.pop(model_id, None)
                self.unload(model_id, "unloaded: its config changed")

    def status(self, model_id: str) -> ModelStatus:
        """State by precedence loading > unloading > loaded > failed > available (contracts Part B §1.6)."""
        entry = self.catalog.get(model_id)
        model_id = entry.model_id
        failure = self._failures.get(model_id)
        if model_id in self._loading:
            return ModelStatus(model_id, ModelState.LOADING, failure)
        if model_id in self._loaded:
            return ModelStatus(model_id, ModelState.LOADED, None, self._loaded[model_id].memory_bytes)
        if failure is not None:
            return ModelStatus(model_id, ModelState.FAILED, failure)
        return ModelStatus(model_id, ModelState.AVAILABLE)

    @property
    def loaded_models(self) -> list[str]:
        return list(self._loaded)

    @property
    def resident(self) -> list[LoadedModel]:
        """The loaded models themselves, least recently used first (reading them marks none as used)."""
        return list(self._loaded.values())

    @property
    def loading_models(self) -> list[str]:
        return list(self._loading)


def _log_loaded(loaded: LoadedModel, seconds: float) -> None:
    logger.info("loaded model %s in %.2fs (%d bytes)", loaded.model_id, seconds, loaded.memory_bytes,
                extra=log_fields(event="model_loaded", model=loaded.model_id, profile=loaded.profile,
                                 seconds=round(seconds, 3), bytes=loaded.memory_bytes))  # fmt: skip
