"""Reading checkpoints for conversion: safetensors decoding, config checks, error messages, cache keys."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import sie.worker.convert.cache_keys as cache_keys
from sie.worker.convert import ConversionError, conversion_cache_key, convert_encoder
from sie.worker.convert.families import parse_encoder_config
from sie.worker.convert.safetensors_io import SafetensorsFile, decode_float

CONFIG = {
    "model_type": "bert", "hidden_act": "gelu", "hidden_size": 4, "num_attention_heads": 2,
    "num_hidden_layers": 1, "intermediate_size": 8, "max_position_embeddings": 6, "vocab_size": 5,
    "type_vocab_size": 2, "layer_norm_eps": 1e-12,
}  # fmt: skip


def write_raw_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    header_bytes = json.dumps(header).encode()
    body = b"".join(raw for _, _, raw in tensors.values())
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + body)


def f32(shape: list[int], value: float = 0.5) -> tuple[str, list[int], bytes]:
    return ("F32", shape, np.full(shape, value, dtype="<f4").tobytes())


def embeddings_only(prefix: str = "") -> dict[str, tuple[str, list[int], bytes]]:
    """A checkpoint whose encoder layers are missing: conversion gets past the embeddings, then fails."""
    return {
        f"{prefix}embeddings.word_embeddings.weight": f32([5, 4]),
        f"{prefix}embeddings.position_embeddings.weight": f32([6, 4]),
        f"{prefix}embeddings.token_type_embeddings.weight": f32([2, 4]),
        f"{prefix}embeddings.LayerNorm.gamma": f32([4], 1.0),
        f"{prefix}embeddings.LayerNorm.beta": f32([4], 0.0),
    }


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    write_raw_safetensors(tmp_path / "model.safetensors", embeddings_only())
    return tmp_path


def test_decode_float_widens_f16_and_bf16() -> None:
    values = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
    assert decode_float(values.astype("<f2").tobytes(), "F16").tolist() == values.tolist()
    bf16 = (values.view("<u4") >> 16).astype("<u2").tobytes()
    assert decode_float(bf16, "BF16").tolist() == values.tolist()  # all three are exact in bfloat16
    assert decode_float(values.astype("<f4").tobytes(), "F32").dtype == np.float32


def test_reader_loads_tensors_by_name_and_skips_metadata(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_raw_safetensors(path, {"a": f32([2, 3], 1.5), "ids": ("I64", [2], np.arange(2, dtype="<i8").tobytes())})
    tensors = SafetensorsFile(path)
    assert tensors.names() == ["a", "ids"]
    np.testing.assert_array_equal(tensors.load("a"), np.full((2, 3), 1.5, dtype=np.float32))
    with pytest.raises(ConversionError, match=r"model\.safetensors: tensor 'ids': dtype I64 is not a float"):
        tensors.load("ids")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x02", "shorter than the 8-byte header length"),
        (struct.pack("<Q", 10**12), "header length .* is not plausible"),
        (struct.pack("<Q", 3) + b"{x]", "header is not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "header is not a JSON object"),
    ],
)
def test_reader_rejects_a_corrupt_header(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(ConversionError, match=message) as caught:
        SafetensorsFile(path)
    assert caught.value.source == str(path)


def test_reader_rejects_offsets_outside_the_data(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 8)
    with pytest.raises(ConversionError, match=r"tensor 'w': data_offsets \[0, 16\] fall outside"):
        SafetensorsFile(path)


def test_reader_rejects_a_size_that_disagrees_with_the_shape(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_raw_safetensors(path, {"w": ("F16", [3], b"\x00" * 8)})
    with pytest.raises(ConversionError, match=r"tensor 'w': holds 8 bytes but F16 \[3\] needs 6"):
        SafetensorsFile(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "qwen3"}, r"model_type 'qwen3' is not an encoder family .*supported: bart, bert, camembert"),
        ({"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"num_attention_heads": 3}, "not a multiple of num_attention_heads 3"),
        ({"vocab_size": None}, "vocab_size None is missing"),
        ({"layer_norm_eps": -1}, "layer_norm_eps -1"),
        ({"id2label": {"0": "A", "2": "C"}}, r"id2label ids \[0, 2\]"),
    ],
)
def test_config_rejects_what_the_graph_cannot_express(change: dict, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        parse_encoder_config(CONFIG | change)


def test_config_orders_labels_by_id() -> None:
    config = parse_encoder_config(CONFIG | {"id2label": {"1": "POS", "0": "NEG"}})
    assert config.labels == ("NEG", "POS")
    assert config.head_size == 2


def test_missing_tensor_names_the_file_and_the_tensor(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError) as caught:
        convert_encoder(model_dir, tmp_path / "out.onnx", "none")
    assert caught.value.tensor == "encoder.layer.0.attention.self.query.weight"
    assert str(model_dir / "model.safetensors") in str(caught.value)
    assert not (tmp_path / "out.onnx").exists()


def test_bert_prefix_is_used_in_the_missing_tensor_name(model_dir: Path, tmp_path: Path) -> None:
    write_raw_safetensors(model_dir / "model.safetensors", embeddings_only("bert."))
    with pytest.raises(ConversionError, match="'bert.encoder.layer.0.attention.self.query.weight'"):
        convert_encoder(model_dir, tmp_path / "out.onnx", "none")


def test_wrong_shape_names_the_stored_tensor(model_dir: Path, tmp_path: Path) -> None:
    tensors = embeddings_only() | {"embeddings.word_embeddings.weight": f32([7, 4])}
    write_raw_safetensors(model_dir / "model.safetensors", tensors)
    with pytest.raises(ConversionError, match=r"'embeddings.word_embeddings.weight': has shape \[7, 4\], expected"):
        convert_encoder(model_dir, tmp_path / "out.onnx", "none")


def test_non_finite_weights_are_rejected(model_dir: Path, tmp_path: Path) -> None:
    tensors = embeddings_only() | {"embeddings.word_embeddings.weight": f32([5, 4], float("nan"))}
    write_raw_safetensors(model_dir / "model.safetensors", tensors)
    with pytest.raises(ConversionError, match="NaN or infinite"):
        convert_encoder(model_dir, tmp_path / "out.onnx", "none")


def test_unknown_head_is_rejected_before_reading(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="unknown head 'colbert'"):
        convert_encoder(model_dir, tmp_path / "out.onnx", "colbert")


def test_missing_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="config.json: cannot read file"):
        convert_encoder(tmp_path, tmp_path / "out.onnx", "mean")


def test_cache_key_follows_content_head_and_version(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = conversion_cache_key(model_dir, "mean")
    assert key == conversion_cache_key(model_dir, "mean")
    assert len(key) == 64
    assert key != conversion_cache_key(model_dir, "cls")
    weights = model_dir / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    assert key != conversion_cache_key(model_dir, "mean")
    weights.write_bytes(original)
    (model_dir / "config.json").write_text(json.dumps(CONFIG | {"layer_norm_eps": 1e-5}))
    changed_config = conversion_cache_key(model_dir, "mean")
    assert changed_config != key
    monkeypatch.setattr(cache_keys, "CONVERTER_VERSION", "sie-bert-onnx/test")
    assert conversion_cache_key(model_dir, "mean") != changed_config


def test_cache_key_of_a_missing_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="config.json: cannot read file"):
        conversion_cache_key(tmp_path, "mean")
