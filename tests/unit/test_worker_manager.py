"""Model manager lifecycle: background loads, failure classes and cooldowns, LRU under a budget, pins.

The load function is the seam under test here, so it is replaced by one that returns sized models.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from sie.catalog import Catalog, parse_bundle, parse_model_config
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
)
from sie.worker.errors import ModelLoadError
from sie.worker.loading import LoadedModel
from sie.worker.manager import ModelManager, ModelState

BUNDLE = parse_bundle({"name": "default", "priority": 10, "adapters": ["sie.adapters.dense"]})


def _model(sie_id: str, batch: int = 1):
    profile = {"adapter_path": "sie.adapters.dense:D", "max_batch_tokens": batch}
    return parse_model_config({"sie_id": sie_id, "hf_id": sie_id, "profiles": {"default": profile}})


CATALOG = Catalog([BUNDLE], [_model("org/a"), _model("org/b"), _model("org/c")])


class Loads:
    """Counts loads; each model costs `sizes[id]` bytes; `errors[id]` makes a load fail."""

    def __init__(self, sizes=None, errors=None, gate: threading.Event | None = None) -> None:
        self.calls: list[str] = []
        self.sizes = sizes or {}
        self.errors = errors or {}
        self.gate = gate

    def __call__(self, model, profile, model_id) -> LoadedModel:
        self.calls.append(model_id)
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if model_id in self.errors:
            raise self.errors[model_id]
        return LoadedModel(model_id, profile, adapter=None, tokenizer=None, memory_bytes=self.sizes.get(model_id, 10))


async def _loaded(manager: ModelManager, model_id: str) -> None:
    await manager.wait_ready(model_id)


async def test_first_use_loads_once_in_the_background() -> None:
    gate = threading.Event()
    loads = Loads(gate=gate)
    async with ModelManager(CATALOG, loads) as manager:
        assert manager.ensure_ready("org/a") == MODEL_STATE_LOADING_STARTED
        assert manager.ensure_ready("ORG/A") == MODEL_STATE_LOADING_IN_PROGRESS
        assert manager.status("org/a").state == ModelState.LOADING
        gate.set()
        await manager.wait_ready("org/a")
        assert manager.ensure_ready("org/a") == MODEL_STATE_READY
        assert loads.calls == ["org/a"]
        assert manager.status("org/a").state == ModelState.LOADED


async def test_unknown_model_is_retry_later() -> None:
    async with ModelManager(CATALOG, Loads()) as manager:
        assert manager.ensure_ready("org/zzz") == MODEL_STATE_RETRY_LATER


async def test_permanent_failure_sticks_until_the_config_changes() -> None:
    loads = Loads(errors={"org/a": ModelLoadError("NOT_FOUND", "Model 'org/a': no such file")})
    async with ModelManager(CATALOG, loads) as manager:
        with pytest.raises(ModelLoadError, match="no such file"):
            await manager.wait_ready("org/a")
        assert manager.ensure_ready("org/a") == MODEL_STATE_FAILED
        status = manager.status("org/a")
        assert status.state == ModelState.FAILED and status.last_error.error_class == "NOT_FOUND"
        assert status.last_error.attempts == 1 and status.last_error.permanent
        assert loads.calls == ["org/a"]
        loads.errors.clear()
        manager.set_catalog(CATALOG.with_models([_model("org/a", batch=2)]))
        assert manager.ensure_ready("org/a") == MODEL_STATE_LOADING_STARTED


async def test_transient_failure_waits_for_its_cooldown() -> None:
    loads = Loads(errors={"org/a": ModelLoadError("OOM", "out of memory")})
    async with ModelManager(CATALOG, loads) as manager:
        now = [1000.0]
        manager.clock = lambda: now[0]
        with pytest.raises(ModelLoadError):
            await manager.wait_ready("org/a")
        assert manager.ensure_ready("org/a") == MODEL_STATE_RETRY_LATER
        now[0] += 61.0
        with pytest.raises(ModelLoadError):
            await manager.wait_ready("org/a")
        assert manager.failure("org/a").attempts == 2
        assert loads.calls == ["org/a", "org/a"]


async def test_unexpected_loader_error_is_a_failed_state_without_its_text() -> None:
    failure = RuntimeError("[ONNXRuntimeError] /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 failed")
    async with ModelManager(CATALOG, Loads(errors={"org/a": failure})) as manager:
        with pytest.raises(ModelLoadError, match="RuntimeError") as raised:
            await manager.wait_ready("org/a")
        last_error = manager.status("org/a").last_error
        assert last_error.error_class == "UNKNOWN"
        # Callers see the kind of failure; runtime text with internal paths stays in the log.
        for message in (raised.value.message, last_error.message):
            assert message == "Model 'org/a' failed to load (RuntimeError); the worker log has the details"


async def test_lru_eviction_under_the_memory_budget() -> None:
    loads = Loads(sizes={"org/a": 40, "org/b": 40, "org/c": 40})
    async with ModelManager(CATALOG, loads, memory_budget_bytes=100) as manager:
        await manager.wait_ready("org/a")
        await manager.wait_ready("org/b")
        assert manager.get("org/a") is not None  # a is now the most recently used
        await manager.wait_ready("org/c")
        assert manager.loaded_models == ["org/a", "org/c"]
        assert manager.memory_bytes == 80


async def test_pinned_models_are_never_evicted() -> None:
    loads = Loads(sizes={"org/a": 60, "org/b": 30, "org/c": 50})
    async with ModelManager(CATALOG, loads, memory_budget_bytes=100) as manager:
        manager.pin(["org/a"])
        await manager.wait_ready("org/a")
        await manager.wait_ready("org/b")
        with pytest.raises(ModelLoadError, match="SIE_WORKER_MEMORY_BUDGET_BYTES=100"):
            await manager.wait_ready("org/c")
        assert manager.loaded_models == ["org/a"]
        assert manager.status("org/c").last_error.error_class == "OOM"


async def test_a_model_a_pool_holds_is_not_evicted_until_released() -> None:
    loads = Loads(sizes={"org/a": 60, "org/b": 30, "org/c": 50})
    async with ModelManager(CATALOG, loads, memory_budget_bytes=100) as manager:
        manager.hold("org/a", keep=True)
        manager.hold("org/unknown", keep=True)  # not in the catalogue: ignored
        await manager.wait_ready("org/a")
        await manager.wait_ready("org/b")
        with pytest.raises(ModelLoadError, match="held by pinned models"):
            await manager.wait_ready("org/c")
        assert manager.is_loaded("org/a") and not manager.is_loaded("org/c")
        manager.hold("org/a", keep=False)  # released: it goes like any other
        later = manager.clock() + 3600.0
        manager.clock = lambda: later  # past the failed load's cooldown
        await manager.wait_ready("org/c")
        assert not manager.is_loaded("org/a") and manager.is_loaded("org/c")


async def test_max_loaded_models() -> None:
    async with ModelManager(CATALOG, Loads(), max_loaded_models=2) as manager:
        for model_id in ("org/a", "org/b", "org/c"):
            await manager.wait_ready(model_id)
        assert manager.loaded_models == ["org/b", "org/c"]


async def test_exit_cancels_loads_in_flight() -> None:
    gate = threading.Event()
    manager = ModelManager(CATALOG, Loads(gate=gate))
    async with manager:
        manager.ensure_ready("org/a")
        assert manager.loading_models == ["org/a"]
        gate.set()
    assert manager.loading_models == []
    await asyncio.sleep(0)
