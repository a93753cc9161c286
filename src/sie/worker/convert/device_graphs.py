"""The small graphs `sie.worker.device_pooling` runs beside a model on a GPU, over the token states the model left in
the device's memory, so that only their results come to the host:

- the pooling graph: token states and their attention mask in, the sentence vectors of every pooling mode out,
  computed as `sie.worker.outputs.pool` computes them on the host;
- a token head: the Dense layers a model applies to every token after the transformer (a ColBERT projection,
  BGE-M3's sparse and ColBERT heads), computed as `sie.worker.sentence_modules.DenseStage` computes them on the host.

Both read float32 or float16 states and compute in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import gelu
from sie.worker.convert.graph_builder import GraphBuilder, tensor_info
from sie.worker.convert.names import POOLED_MODES, POOLING_ATTENTION_MASK, POOLING_TOKEN_STATES, TOKEN_HEAD_OUTPUT

# sentence-transformers clamps the token count at 1e-9 (as outputs.pool does).
MIN_TOKEN_COUNT: Final = 1e-9
# The token states' types it reads, by onnxruntime's names.
ELEMENT_TYPES: Final = {"tensor(float)": TensorProto.FLOAT, "tensor(float16)": TensorProto.FLOAT16}
# A Dense layer's activation (torch's class name, as sentence_modules.ACTIVATIONS reads it) -> its ONNX operator;
# GELU is spelled out (exact, erf) and Identity adds nothing.
ACTIVATION_OPS: Final = {"Tanh": "Tanh", "ReLU": "Relu", "Sigmoid": "Sigmoid"}


class TokenStage(Protocol):
    """One Dense layer over each token: `activation(x @ weight + bias)`, plus `x @ residual` where it has one
    (`sie.worker.sentence_modules.DenseStage` is one)."""

    weight: np.ndarray  # [in, out]
    bias: np.ndarray | None
    activation: str
    residual: np.ndarray | None


def pooling_graph(states_type: str) -> bytes:
    """The pooling model for token states of `states_type` (ELEMENT_TYPES): `token_states [batch, sequence,
    hidden]` and `attention_mask [batch, sequence]` (int64) in, `mean`, `cls` and `last` `[batch, hidden]` float32
    out, each accumulated in float32."""
    element_type = ELEMENT_TYPES[states_type]
    b = GraphBuilder()
    states = _float_states(b, element_type)
    mask = b.op("Cast", [POOLING_ATTENTION_MASK], "mask", to=TensorProto.FLOAT)
    weighted = b.op("Mul", [states, b.op("Unsqueeze", [mask, b.const([2])], "mask_3d")], "weighted")
    summed = b.op("ReduceSum", [weighted, b.const([1])], "summed", keepdims=0)
    counts = b.op("ReduceSum", [mask, b.const([1])], "counts", keepdims=1)
    floor = b.const(MIN_TOKEN_COUNT, np.float32)
    b.op("Div", [summed, b.op("Max", [counts, floor], "clamped_counts")], "mean")
    b.op("Gather", [states, b.const(0)], "cls", axis=1)
    # The last real token's row (right padding: the mask's count minus one; a row without tokens reads its first).
    lengths = b.op("ReduceSum", [POOLING_ATTENTION_MASK, b.const([1])], "lengths", keepdims=1)
    last_index = b.op("Max", [b.op("Sub", [lengths, b.const(1)], "last_position"), b.const(0)], "last_index")
    hidden = b.op("Slice", [b.op("Shape", [states], "shape"), b.const([2]), b.const([3])], "hidden")
    batch = b.op("Slice", [b.op("Shape", [states], "shape"), b.const([0]), b.const([1])], "batch")
    index_shape = b.op("Concat", [batch, b.const([1]), hidden], "index_shape", axis=0)
    indices = b.op("Expand", [b.op("Unsqueeze", [last_index, b.const([2])], "last_3d"), index_shape], "indices")
    gathered = b.op("GatherElements", [states, indices], "gathered", axis=1)
    b.op("Squeeze", [gathered, b.const([1])], "last")
    inputs = [
        tensor_info(POOLING_TOKEN_STATES, element_type, ["batch", "sequence", "hidden"]),
        tensor_info(POOLING_ATTENTION_MASK, TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [tensor_info(mode, TensorProto.FLOAT, ["batch", "hidden"]) for mode in POOLED_MODES]
    return b.model("pooling", inputs, outputs).SerializeToString()


def token_head_graph(states_type: str, stages: Sequence[TokenStage]) -> bytes:
    """The model of a token head: `token_states [batch, sequence, hidden]` of `states_type` in, `stages` (at least
    one) applied in order to every token, `token_vectors [batch, sequence, width]` float32 out."""
    if not stages:
        raise ValueError("a token head needs at least one stage")
    element_type = ELEMENT_TYPES[states_type]
    b = GraphBuilder()
    x = _float_states(b, element_type)
    for index, stage in enumerate(stages):
        name = f"stage{index}"
        out = b.op("MatMul", [x, b.weight(f"{name}.weight", stage.weight)], f"{name}.product")
        if stage.bias is not None:
            out = b.op("Add", [out, b.weight(f"{name}.bias", stage.bias)], f"{name}.biased")
        if stage.activation == "GELU":
            out = gelu(b, out, f"{name}.gelu")
        elif stage.activation != "Identity":
            if stage.activation not in ACTIVATION_OPS:
                raise ValueError(f"a token head cannot apply the activation {stage.activation!r}")
            out = b.op(ACTIVATION_OPS[stage.activation], [out], f"{name}.activated")
        if stage.residual is not None:
            residual = b.op("MatMul", [x, b.weight(f"{name}.residual", stage.residual)], f"{name}.residual_product")
            out = b.op("Add", [out, residual], f"{name}.with_residual")
        x = out
    b.op("Identity", [x], TOKEN_HEAD_OUTPUT)
    inputs = [tensor_info(POOLING_TOKEN_STATES, element_type, ["batch", "sequence", "hidden"])]
    outputs = [tensor_info(TOKEN_HEAD_OUTPUT, TensorProto.FLOAT, ["batch", "sequence", "width"])]
    return b.model("token_head", inputs, outputs).SerializeToString()


def _float_states(b: GraphBuilder, element_type: int) -> str:
    """The token states input, as float32."""
    if element_type == TensorProto.FLOAT:
        return POOLING_TOKEN_STATES
    return b.op("Cast", [POOLING_TOKEN_STATES], "states", to=TensorProto.FLOAT)
