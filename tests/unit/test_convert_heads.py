"""Every conversion head against a plain numpy BERT on small random weights (F32, F16 and BF16 files)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import sie.worker.convert.graph_builder as graph_builder
from sie.worker.convert import HEADS, convert_encoder
from support.bert_reference import (
    HIDDEN,
    LAYERS,
    SEQUENCES,
    TOLERANCE,
    TYPE_VOCAB,
    VOCAB,
    reference_outputs,
    write_checkpoint,
)

# --- running the converted graph ------------------------------------------------------------------


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def padded_batch(sequences: tuple, seed: int = 7) -> dict[str, np.ndarray]:
    width = max(len(ids) for ids, _ in sequences)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=(len(sequences), width))
    types = rng.integers(0, TYPE_VOCAB, size=(len(sequences), width))
    mask = np.zeros((len(sequences), width), dtype=np.int64)
    for row, (seq_ids, seq_types) in enumerate(sequences):
        ids[row, : len(seq_ids)], types[row, : len(seq_ids)], mask[row, : len(seq_ids)] = seq_ids, seq_types, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def valid_part(value: np.ndarray, length: int) -> np.ndarray:
    """One row of an output: per-token rows ([S, ...]) are cut to the real tokens, pooled rows kept whole."""
    return value[:length] if value.ndim == 2 else value


CASES = [  # head, dtype, name prefix, gamma/beta LayerNorm names, untied decoder
    pytest.param("none", "F32", "", False, False, id="none-f32"),
    pytest.param("mean", "F32", "", False, False, id="mean-f32"),
    pytest.param("cls", "F32", "", False, False, id="cls-f32"),
    pytest.param("seq-cls", "F32", "bert.", False, False, id="seq-cls-f32-prefixed"),
    pytest.param("token-cls", "F32", "bert.", False, False, id="token-cls-f32-prefixed"),
    pytest.param("mlm-splade", "F32", "bert.", False, False, id="mlm-splade-f32-prefixed"),
    pytest.param("mlm-splade", "F32", "bert.", False, True, id="mlm-splade-f32-untied"),
    pytest.param("mean", "F16", "", False, False, id="mean-f16"),
    pytest.param("token-cls", "F16", "bert.", True, False, id="token-cls-f16-gamma-beta"),
    pytest.param("mlm-splade", "BF16", "bert.", False, False, id="mlm-splade-bf16"),
    pytest.param("mlm-splade-sum", "F32", "bert.", False, False, id="mlm-splade-sum-f32"),
    pytest.param("mlm-splade-sum-log1p", "F16", "bert.", False, True, id="mlm-splade-sum-log1p-f16-untied"),
    pytest.param("seq-cls", "BF16", "", True, False, id="seq-cls-bf16-gamma-beta"),
    pytest.param("seq-cls-states", "F32", "bert.", False, False, id="seq-cls-states-f32-prefixed"),
]


def test_cases_cover_every_head() -> None:
    assert {case.values[0] for case in CASES} == set(HEADS)


@pytest.mark.parametrize(("head", "dtype", "prefix", "legacy", "untied"), CASES)
def test_head_matches_numpy_reference(
    tmp_path: Path, head: str, dtype: str, prefix: str, legacy: bool, untied: bool
) -> None:
    weights = write_checkpoint(tmp_path, dtype, prefix, legacy, untied)
    result = convert_encoder(tmp_path, tmp_path / "model.onnx", head)
    assert result.output_names == HEADS[head].outputs
    runner = session(result.path)
    batch = dict(zip(result.output_names, runner.run(None, padded_batch(SEQUENCES)), strict=True))
    for row, (ids, types) in enumerate(SEQUENCES):
        expected = reference_outputs(head, weights, ids, types)
        single_feed = padded_batch(((ids, types),))
        single = dict(zip(result.output_names, runner.run(None, single_feed), strict=True))
        for name in result.output_names:
            got = valid_part(batch[name][row], len(ids))
            np.testing.assert_allclose(got, expected[name], rtol=0, atol=TOLERANCE, err_msg=f"{name} row {row}")
            # Padding must not leak: the padded row equals the sequence run on its own.
            np.testing.assert_allclose(got, single[name][0], rtol=0, atol=TOLERANCE, err_msg=f"{name} single")


# --- graph properties --------------------------------------------------------------------------------


def vocab_tables(path: Path) -> int:
    return sum(list(t.dims) == [VOCAB, HIDDEN] for t in onnx.load(str(path)).graph.initializer)


@pytest.mark.parametrize(("untied", "tables"), [(False, 1), (True, 2)])
def test_tied_decoder_reuses_the_word_embedding_table(tmp_path: Path, untied: bool, tables: int) -> None:
    write_checkpoint(tmp_path, "F32", "bert.", untied=untied)
    result = convert_encoder(tmp_path, tmp_path / "splade.onnx", "mlm-splade")
    assert vocab_tables(result.path) == tables


def test_graph_is_opset_17_with_dynamic_int64_inputs(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, "F32")
    model = onnx.load(str(convert_encoder(tmp_path, tmp_path / "model.onnx", "mean").path))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17), ("com.microsoft", 1)]
    inputs = [
        (value.name, value.type.tensor_type.elem_type, [d.dim_param for d in value.type.tensor_type.shape.dim])
        for value in model.graph.input
    ]
    assert inputs == [
        (name, onnx.TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    assert [o.name for o in model.graph.output] == ["last_hidden_state", "sentence_embedding"]


def test_each_layer_is_one_fused_attention_and_two_residual_norms(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, "F32")
    model = onnx.load(str(convert_encoder(tmp_path, tmp_path / "model.onnx", "none").path))
    ops = Counter((node.domain, node.op_type) for node in model.graph.node)
    assert ops["com.microsoft", "Attention"] == LAYERS
    # the residual + LayerNorm pairs unfused (onnxruntime's SkipLayerNormalization is slower on CPU), the
    # embeddings' LayerNorm beside them
    assert ops["com.microsoft", "SkipLayerNormalization"] == 0
    assert ops["", "LayerNormalization"] == 1 + 2 * LAYERS
    assert ops["", "Transpose"] == ops["", "Softmax"] == 0


def test_onnxruntime_fuses_bias_and_gelu(tmp_path: Path) -> None:
    """ORT_ENABLE_ALL rewrites MatMul + bias Add into Gemm and the erf pattern into a Gelu kernel (Q/K/V is inside
    the fused Attention)."""
    write_checkpoint(tmp_path, "F32")
    result = convert_encoder(tmp_path, tmp_path / "model.onnx", "mean")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3  # ORT warns that an ENABLE_ALL graph is hardware specific
    ort.InferenceSession(str(result.path), options, providers=["CPUExecutionProvider"])
    ops = Counter(node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node)
    assert ops["Gemm"] == 3 * LAYERS  # attention output, intermediate, output
    assert ops["Attention"] == LAYERS
    assert ops["Gelu"] + ops["BiasGelu"] == LAYERS
    assert ops["Erf"] == 0


@pytest.mark.parametrize("head", ["mean", "mlm-splade"])
def test_a_row_of_only_padding_gives_finite_outputs(tmp_path: Path, head: str) -> None:
    write_checkpoint(tmp_path, "F32", "bert.")
    runner = session(convert_encoder(tmp_path, tmp_path / "model.onnx", head).path)
    feeds = padded_batch(SEQUENCES)
    feeds["attention_mask"][1] = 0
    for output in runner.run(None, feeds):
        assert np.isfinite(output).all()
    pooled = runner.run(None, feeds)[-1][1]
    np.testing.assert_array_equal(pooled, np.zeros_like(pooled))  # nothing to pool: a zero vector


def test_a_graph_over_the_side_file_size_keeps_its_tensors_in_a_side_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_checkpoint(tmp_path, "F32")
    inline_path = convert_encoder(tmp_path, tmp_path / "inline.onnx", "mean").path
    inline = session(inline_path).run(None, padded_batch(SEQUENCES))
    monkeypatch.setattr(graph_builder, "SIDE_FILE_BYTES", 0)
    result = convert_encoder(tmp_path, tmp_path / "external.onnx", "mean")
    assert (tmp_path / "external.onnx.data").stat().st_size > 0
    external = session(result.path).run(None, padded_batch(SEQUENCES))
    for left, right in zip(inline, external, strict=True):
        np.testing.assert_array_equal(left, right)
