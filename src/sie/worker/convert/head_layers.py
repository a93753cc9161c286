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


def marker_span_logits(  # noqa: PLR0913 - the layer's inputs, name and widths
    b: GraphBuilder, weights: HeadWeights, words: str, queries: str, name: str, width: int, widths: int
) -> str:
    """GLiNER's `markerV0` span layer `name` scored against `queries` [B, Q, width]: every span of up to `widths`
    words of `words` [B, W, width] is its start word's and end word's projections, concatenated and projected again,
    and its logit against a query is their dot product; out [B, W, widths, Q] (a span running past the last word
    reads zeros there and is never read). The last projection goes either through the spans or through the queries,
    two equal forms an `If` picks between at run time by their cost (below)."""
    starts = projection_mlp(b, weights, words, f"{name}.project_start", width, width)
    ends = projection_mlp(b, weights, words, f"{name}.project_end", width, width)
    # out_project's first layer over [relu(start), relu(end)] is the sum of its two halves, each applied once per
    # word; the end word of width k is the word k places on (past the last word: zeros, never read).
    first = weights.get(f"{name}.out_project.0.weight", (4 * width, 2 * width))
    first_bias = weights.get(f"{name}.out_project.0.bias", (4 * width,))
    start_part = b.op("MatMul", [b.op("Relu", [starts], "span.start_relu"),
                                 b.weight("span.out0.start", first[:, :width].T)], "span.start_part")  # fmt: skip
    start_part = b.op("Add", [start_part, b.weight("span.out0.bias", first_bias)], "span.start_biased")
    end_part = b.op("MatMul", [b.op("Relu", [ends], "span.end_relu"),
                               b.weight("span.out0.end", first[:, width:].T)], "span.end_part")  # fmt: skip
    padded = b.op("Pad", [end_part, b.const([0, 0, 0, 0, widths - 1, 0])], "span.end_padded")
    word_count = b.op("Shape", [words], "shape.words", start=1, end=2)
    second = b.weight("span.out3.weight", weights.get(f"{name}.out_project.3.weight", (width, 4 * width)).T)
    second_bias = weights.get(f"{name}.out_project.3.bias", (width,))
    queries_t = b.op("Transpose", [queries], "span.queries_t", perm=[0, 2, 1])  # [B, D, Q]

    def hidden_of(k: int) -> str:
        """The spans of width k before out_project's second layer, [B, W, 4D]."""
        stop = b.op("Add", [word_count, b.const([k])], f"span.stop{k}")
        shifted = b.op("Slice", [padded, b.const([k]), stop, b.const([1])], f"span.end{k}")
        return b.op("Relu", [b.op("Add", [start_part, shifted], f"span.width{k}")], f"span.relu{k}")

    def stacked(per_width: list[str]) -> str:
        per_width = [b.op("Unsqueeze", [logits, b.const([2])], f"span.logits{k}_4d") for k, logits in
                     enumerate(per_width)]  # fmt: skip
        return b.op("Concat", per_width, "span.logits", axis=2) if widths > 1 else per_width[0]

    def projected_spans() -> str:
        # the spans' representations, [B, W, D] one width at a time (no [B, W, K, 4D] tensor is held), each
        # scored against the queries into [B, W, Q]
        bias = b.weight("span.out3.bias", second_bias)
        return stacked([b.op("MatMul", [b.op("Add", [b.op("MatMul", [hidden_of(k), second], f"span.projected{k}"),
                                                     bias], f"span.rep{k}"), queries_t], f"span.scores{k}")
                        for k in range(widths)])  # fmt: skip

    def folded_queries() -> str:
        # (h · W2 + b2) · q = h · (W2 · q) + b2 · q: the queries go through the second layer instead of the spans,
        # [B, 4D, Q] once; each width is then one product of its [B, W, 4D] with it
        folded = b.op("MatMul", [second, queries_t], "span.folded_queries")
        offsets = b.op("MatMul", [b.weight("span.out3.bias_row", second_bias[None, :]), queries_t],
                       "span.query_offsets")  # [B, 1, Q]  # fmt: skip
        return stacked([b.op("Add", [b.op("MatMul", [hidden_of(k), folded], f"span.folded{k}"), offsets],
                             f"span.scores{k}") for k in range(widths)])  # fmt: skip

    # Per width, projecting the spans costs W·4D·D + W·D·Q multiply-adds, folding the queries W·4D·Q: folding is
    # cheaper while Q < 4D/3 (a uni-encoder's labels sit in its prompt; a bi-encoder may send a thousand). It also
    # holds the folded queries, [B, 4D, Q], beside each width's [B, W, 4D]: only while Q ≤ W, so that they take no
    # more memory than one width's spans (short texts under many labels project).
    label_count = b.op("Shape", [queries], "span.label_count", start=1, end=2)
    cheaper = b.op("Less", [label_count, b.const([4 * width // 3])], "span.fold_cheaper")
    smaller = b.op("LessOrEqual", [label_count, word_count], "span.fold_smaller")
    fold = b.op("Squeeze", [b.op("And", [cheaper, smaller], "span.fold_1d"), b.const([0])], "span.fold")
    return b.op("If", [fold], "span.logits_chosen", then_branch=b.branch("span_folded", folded_queries),
                else_branch=b.branch("span_projected", projected_spans))  # fmt: skip


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
