"""The layers the zero-shot heads (GLiNER's spans, GLiREL's relations, GLiClass's classes) build beside a backbone
encoder: a checkpoint's own tensors by name with their shapes checked, Linear layers, the GLiNER family's projection
MLPs, rows gathered by position, and torch's bidirectional LSTM over right-padded rows (a packed sequence: padding
neither read nor written) as ONNX's LSTM."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder
from sie.worker.convert.safetensors_io import Checkpoint


class HeadWeights:
    """A head's tensors (everything but the backbone), shapes checked."""

    def __init__(self, checkpoint: Checkpoint, prefix: str = "") -> None:
        self._checkpoint = checkpoint
        self.prefix = prefix

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        stored = self.prefix + name
        if stored not in self._checkpoint:
            raise ConversionError("required tensor is missing", source=str(self._checkpoint.path), tensor=stored)
        array = self._checkpoint.load(stored)
        if array.shape != shape:
            raise ConversionError(f"has shape {list(array.shape)}, expected {list(shape)}",
                                  source=str(self._checkpoint.path), tensor=stored)  # fmt: skip
        return array

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of `name` (a layer whose width the config does not say)."""
        stored = self.prefix + name
        if stored not in self._checkpoint:
            raise ConversionError("required tensor is missing", source=str(self._checkpoint.path), tensor=stored)
        return tuple(self._checkpoint.entries[stored].shape)

    def has(self, name: str) -> bool:
        return self.prefix + name in self._checkpoint


def linear(b: GraphBuilder, weights: HeadWeights, x: str, name: str, width_in: int, width_out: int) -> str:
    """torch's Linear `name` (weight [out, in] and bias) applied to the last axis of `x`."""
    weight = weights.get(f"{name}.weight", (width_out, width_in))
    bias = weights.get(f"{name}.bias", (width_out,))
    product = b.op("MatMul", [x, b.weight(f"{name}.weight", weight.T)], f"{name}.matmul")
    return b.op("Add", [product, b.weight(f"{name}.bias", bias)], name)


def gather_rows(b: GraphBuilder, values: str, positions: str, width: int, name: str) -> str:
    """Rows of `values` [B, S, width] at `positions` [B, N] (int64): [B, N, width]."""
    index = b.op("Unsqueeze", [positions, b.const([2])], f"{name}.index")
    shape = b.op("Concat", [b.op("Shape", [positions], f"{name}.shape"), b.const([width])], f"{name}.index_shape",
                 axis=0)  # fmt: skip
    expanded = b.op("Expand", [index, shape], f"{name}.index_expanded")
    return b.op("GatherElements", [values, expanded], name, axis=1)


def projection_mlp(  # noqa: PLR0913 - the layer's name and widths
    b: GraphBuilder, weights: HeadWeights, x: str, name: str, width_in: int, width_out: int, inner: int | None = None
) -> str:
    """The GLiNER family's projection layer `name`: Linear to `inner` (4 × the output width unless said), ReLU,
    (dropout), Linear — torch's `Sequential` indices 0 and 3."""
    inner = inner or 4 * width_out
    hidden = b.op("Relu", [linear(b, weights, x, f"{name}.0", width_in, inner)], f"{name}.relu")
    return linear(b, weights, hidden, f"{name}.3", inner, width_out)


def bidirectional_lstm(  # noqa: PLR0913 - one layer's inputs and names
    b: GraphBuilder, weights: HeadWeights, x: str, lengths: str, name: str, width: int, layer: int = 0
) -> str:
    """Layer `layer` of torch's bidirectional LSTM `name` (input and output width `width`, `width / 2` per direction)
    over each row's first `lengths` [B] steps of `x` [B, T, width]; out [B, T, width], the directions' halves
    concatenated, zeros past a row's length."""
    half = width // 2
    kernels, recurrents, biases = [], [], []
    for suffix in ("", "_reverse"):
        kernels.append(_onnx_gates(weights.get(f"{name}.weight_ih_l{layer}{suffix}", (4 * half, width))))
        recurrents.append(_onnx_gates(weights.get(f"{name}.weight_hh_l{layer}{suffix}", (4 * half, half))))
        bias_in = _onnx_gates(weights.get(f"{name}.bias_ih_l{layer}{suffix}", (4 * half,)))
        bias_hidden = _onnx_gates(weights.get(f"{name}.bias_hh_l{layer}{suffix}", (4 * half,)))
        biases.append(np.concatenate([bias_in, bias_hidden]))
    tag = f"{name}.l{layer}"
    steps = b.op("Transpose", [x], f"{tag}.time_major", perm=[1, 0, 2])
    counts = b.op("Cast", [lengths], f"{tag}.lengths", to=TensorProto.INT32)
    output = b.op("LSTM", [steps, b.weight(f"{tag}.W", np.stack(kernels)), b.weight(f"{tag}.R", np.stack(recurrents)),
                           b.weight(f"{tag}.B", np.stack(biases)), counts],
                  f"{tag}.out", direction="bidirectional", hidden_size=half)  # fmt: skip
    # [T, 2, B, width/2] -> [B, T, 2, width/2] -> [B, T, width]
    batch_major = b.op("Transpose", [output], f"{tag}.batch_major", perm=[2, 0, 1, 3])
    return b.op("Reshape", [batch_major, b.const([0, 0, width])], f"{tag}.output")


def _onnx_gates(values: np.ndarray) -> np.ndarray:
    """torch's LSTM gate blocks (input, forget, cell, output) in ONNX's order (input, output, forget, cell)."""
    i, f, g, o = np.split(values, 4, axis=0)
    return np.concatenate([i, o, f, g], axis=0)
