"""GraphBuilder and save_graph, the layer every converter writes its graph through: tensors equal to what
`numpy_helper.from_array` makes, one model per builder, and graphs past protobuf's 2 GiB written with their tensors in
a side file that onnxruntime reads (the limit lowered here, so a few bytes stand for gigabytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from sie.worker.convert import graph_builder
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info

ARRAYS = {
    "float32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "float16": np.linspace(-2, 2, 10, dtype=np.float16),
    "int64": np.array([3, -1, 7], dtype=np.int64),
    "scalar": np.asarray(2.5, dtype=np.float32),
    "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not C-contiguous: stored in C order
}


def doubled(weight: np.ndarray) -> GraphBuilder:
    """x -> x + weight + weight, with `weight` stored once and a small constant shared."""
    builder = GraphBuilder()
    name = builder.weight("w", weight)
    once = builder.op("Add", ["x", name], "once")
    builder.op("Add", [once, name], "y")
    assert builder.const([1, 2]) == builder.const([1, 2])  # stored once by value
    return builder


@pytest.mark.parametrize("kind", sorted(ARRAYS))
def test_stored_tensors_equal_what_from_array_makes(kind: str) -> None:
    array = ARRAYS[kind]
    builder = GraphBuilder()
    dtype = np.float16 if array.dtype == np.float16 else np.float32
    name = builder.const(array, array.dtype.type) if kind == "int64" else builder.weight(kind, array, dtype)
    model = builder.model("g", [], [])
    (tensor,) = [t for t in model.graph.initializer if t.name == name]
    assert tensor == numpy_helper.from_array(np.asarray(array, dtype=array.dtype), name)
    assert graph_builder._tensor_bytes(tensor) == len(tensor.raw_data)


def test_a_builder_emits_one_model() -> None:
    builder = doubled(np.ones(4, np.float32))
    model = builder.model("g", [tensor_info("x", TensorProto.FLOAT, [4])], [tensor_info("y", TensorProto.FLOAT, [4])])
    assert [node.op_type for node in model.graph.node] == ["Add", "Add"]
    assert {t.name for t in model.graph.initializer} == {"w", "const_0"}
    with pytest.raises(RuntimeError, match="emitted its model"):
        builder.model("again", [], [])
    with pytest.raises(RuntimeError, match="emitted its model"):
        builder.weight("late", np.ones(1, np.float32))


def test_branches_of_an_if_read_the_graph_around_them_and_its_weights(tmp_path: Path) -> None:
    builder = GraphBuilder()
    scale = builder.weight("scale", np.array([3.0], np.float32))
    doubled = builder.op("Add", ["x", "x"], "doubled")  # outside the branches, read by one of them
    total = builder.op("ReduceSum", ["x"], "total", keepdims=0)
    positive = builder.op("Greater", [total, builder.const(0.0, np.float32)], "positive")
    then_branch = builder.branch("scaled", lambda: builder.op("Mul", [doubled, scale], "scaled"))
    else_branch = builder.branch("negated", lambda: builder.op("Neg", ["x"], "negated"))
    builder.op("If", [positive], "y", then_branch=then_branch, else_branch=else_branch)
    builder.op("Identity", [builder.const([1], np.int64)], "unused")  # the builder goes on after its branches
    model = builder.model("g", [tensor_info("x", TensorProto.FLOAT, [2])], [tensor_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "if.onnx"
    save_graph(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.array([1.0, 2.0], np.float32)
    assert session.run(["y"], {"x": x})[0].tolist() == [6.0, 12.0]
    assert session.run(["y"], {"x": -x})[0].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("limit", [graph_builder.SIDE_FILE_BYTES, 8], ids=["inline", "side-file"])
def test_a_saved_graph_runs_in_onnxruntime_with_its_tensors_inline_or_in_a_side_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    monkeypatch.setattr(graph_builder, "SIDE_FILE_BYTES", limit)
    weight = np.arange(512, dtype=np.float32)  # onnx leaves tensors under 1 KiB inline even in a side-file graph
    model = doubled(weight).model(
        "g", [tensor_info("x", TensorProto.FLOAT, [512])], [tensor_info("y", TensorProto.FLOAT, [512])]
    )
    path = tmp_path / "model.onnx"
    save_graph(model, path)
    side_file = tmp_path / "model.onnx.data"
    assert side_file.is_file() == (limit == 8)
    assert not (tmp_path / "model.onnx.partial").exists()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.full(512, 10, np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, x + 2 * weight)
