"""The pooling graph `device_pooling` runs beside a dense encoder on a GPU: token states and their attention mask
in, the sentence vectors of every pooling mode out, computed as `sie.worker.outputs.pool` computes them on the host."""

from __future__ import annotations

from typing import Final

import numpy as np
from onnx import TensorProto

from sie.worker.convert.graph_builder import GraphBuilder, tensor_info
from sie.worker.convert.names import POOLED_MODES, POOLING_ATTENTION_MASK, POOLING_TOKEN_STATES

# sentence-transformers clamps the token count at 1e-9 (as outputs.pool does).
MIN_TOKEN_COUNT: Final = 1e-9
# The token states' types it reads, by onnxruntime's names.
ELEMENT_TYPES: Final = {"tensor(float)": TensorProto.FLOAT, "tensor(float16)": TensorProto.FLOAT16}


def pooling_graph(states_type: str) -> bytes:
    """The pooling model for token states of `states_type` (ELEMENT_TYPES): `token_states [batch, sequence,
    hidden]` and `attention_mask [batch, sequence]` (int64) in, `mean`, `cls` and `last` `[batch, hidden]` float32
    out, each accumulated in float32."""
    element_type = ELEMENT_TYPES[states_type]
    b = GraphBuilder()
    states = POOLING_TOKEN_STATES
    if element_type != TensorProto.FLOAT:
        states = b.op("Cast", [POOLING_TOKEN_STATES], "states", to=TensorProto.FLOAT)
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
