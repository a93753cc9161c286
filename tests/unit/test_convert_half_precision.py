"""The half-precision pass on a graph made for it (`convert/half_precision.py`): products in float16, one Cast per
tensor however many products read it, none between two products, a weight that something else reads too kept in
float32 beside its float16 copy, an `If` branch's products converted over the outer graph's tensors, and the
results within float16's rounding of the float32 graph's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from sie.worker.convert.graph_builder import CONTRIB_DOMAIN, GraphBuilder, tensor_info
from sie.worker.convert.half_precision import products_in_half

WIDTH = 8


def model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    table = b.weight("table", rng.normal(size=(WIDTH, WIDTH)))  # read by a Gather and a MatMul
    looked_up = b.op("Gather", [table, b.const([1, 2])], "looked_up")
    first = b.op("MatMul", ["x", b.weight("w1", rng.normal(size=(WIDTH, WIDTH)))], "first")
    second = b.op("MatMul", ["x", table], "second")  # reads x as `first` does: one Cast of x
    chained = b.op("MatMul", [first, b.weight("w2", rng.normal(size=(WIDTH, WIDTH)))], "chained")  # no Cast between
    summed = b.op("Add", [b.op("Add", [chained, second], "sum"), b.op("ReduceSum", [looked_up, b.const([0])],
                                                                         "row", keepdims=1)], "summed")  # fmt: skip
    attention = b.op("Attention", [b.op("Unsqueeze", [summed, b.const([0])], "tokens"),
                                   b.weight("qkv", rng.normal(size=(WIDTH, 3 * WIDTH)) / 4),
                                   b.weight("qkv_bias", rng.normal(size=(3 * WIDTH,))), "mask"],
                     "attention", domain=CONTRIB_DOMAIN, num_heads=2)  # fmt: skip
    attended = b.op("Squeeze", [attention, b.const([0])], "attended")
    w3 = b.weight("w3", rng.normal(size=(WIDTH, WIDTH)))
    then_branch = b.branch("then", lambda: b.op("MatMul", [attended, w3], "then_product"))
    else_branch = b.branch("else", lambda: b.op("Mul", [attended, b.const(2.0, np.float32)], "else_scaled"))
    total = b.op("ReduceSum", ["x"], "total", keepdims=0)
    positive = b.op("Greater", [total, b.const(-1e9, np.float32)], "positive")  # always: the products' branch
    chosen = b.op("If", [positive], "chosen", then_branch=then_branch, else_branch=else_branch)
    kernel = b.weight("kernel", rng.normal(size=(4, 3, 2, 2)))
    image = b.op("Conv", ["pixels", kernel, b.weight("kernel_bias", np.ones(4))], "patches", strides=[2, 2])
    b.op("Identity", [chosen], "out")
    b.op("Identity", [image], "image")
    return b.model(
        "half",
        [tensor_info("x", TensorProto.FLOAT, [4, WIDTH]), tensor_info("mask", TensorProto.INT32, [1]),
         tensor_info("pixels", TensorProto.FLOAT, [1, 3, 4, 4])],
        [tensor_info("out", TensorProto.FLOAT, [4, WIDTH]), tensor_info("image", TensorProto.FLOAT, [1, 4, 2, 2])],
    )  # fmt: skip


def run(graph: onnx.ModelProto) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(4, WIDTH)).astype(np.float32), "mask": np.asarray([3], np.int32),
             "pixels": rng.normal(size=(1, 3, 4, 4)).astype(np.float32)}  # fmt: skip
    return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_products_run_in_float16_within_its_rounding_of_float32() -> None:
    full = model()
    expected = run(full)
    half = products_in_half(model())
    onnx.checker.check_model(half)
    for ours, theirs in zip(run(half), expected, strict=True):
        assert ours.dtype == np.float32  # the outputs stay float32
        difference = float(np.abs(ours - theirs).max())
        assert 0 < difference <= 3e-3 * max(1.0, float(np.abs(theirs).max()))


def test_each_tensor_is_cast_once_and_weights_are_stored_in_the_precision_their_readers_need() -> None:
    graph = products_in_half(model()).graph
    types = {tensor.name: tensor.data_type for tensor in graph.initializer}
    # w1, w2, the fused attention's and the convolution's weights are read by products only: float16 alone
    for name in ("w1", "w2", "qkv", "qkv_bias", "kernel", "kernel_bias", "w3"):
        assert name not in types and types[f"{name}.float16"] == TensorProto.FLOAT16
    # the table is read by a Gather too: kept in float32 beside its float16 copy
    assert types["table"] == TensorProto.FLOAT and types["table.float16"] == TensorProto.FLOAT16
    casts = [node for node in graph.node if node.op_type == "Cast"]
    to_half = [node.input[0] for node in casts if node.attribute[0].i == TensorProto.FLOAT16]
    assert sorted(to_half) == sorted(set(to_half))  # x is cast once for its two products
    assert "x" in to_half and "first" not in to_half  # `chained` reads `first`'s float16 result directly
    back = {node.output[0] for node in casts if node.attribute[0].i == TensorProto.FLOAT}
    assert "first" not in back  # nothing but a product reads it: no Cast back to float32
    assert {"second", "chained", "patches"} <= back
    mask_reader = next(node for node in graph.node if node.op_type == "Attention")
    assert mask_reader.input[3] == "mask"  # the mask index stays int32
    if_node = next(node for node in graph.node if node.op_type == "If")
    then_branch = next(attribute.g for attribute in if_node.attribute if attribute.name == "then_branch")
    (product,) = [node for node in then_branch.node if node.op_type == "MatMul"]
    assert product.input[1] == "w3.float16"  # the branch reads the outer graph's float16 weight
    assert [node.op_type for node in then_branch.node] == ["Cast", "MatMul", "Cast"]
    assert helper.get_attribute_value(then_branch.node[-1].attribute[0]) == TensorProto.FLOAT
