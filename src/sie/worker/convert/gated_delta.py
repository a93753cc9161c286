"""Qwen3.5's linear-attention layers (transformers' `Qwen3_5GatedDeltaNet`), as ONNX nodes the decoder graph adds in
place of attention: the gated delta rule, a recurrent state per value head that each token decays, corrects and
reads.

Per layer: one product gives the q/k/v channels, the output gate `z` and the per-head `b` and `a`; the q/k/v channels
pass a causal depthwise convolution (kernel `conv_kernel`) and SiLU; queries and keys are L2-normalised (queries also
scaled by 1/sqrt(key_dim)) and repeated over the value heads they serve; each token t then updates the head's state S
[key_dim, value_dim] as

    S ← S · exp(g_t);  S ← S + k_t ⊗ β_t (v_t − Sᵀk_t);  o_t = Sᵀq_t

with β = sigmoid(b) and g = −exp(A_log) · softplus(a + dt_bias), and the output is RMSNorm(o) · weight · SiLU(z),
projected back to the hidden size. The rule runs in float32 in every precision, in one of two forms chosen per run
by an ONNX `If` on its length, as transformers chooses: a decode step's one token is the rule once
(`single_step_rule`); a prompt's tokens go in chunks of CHUNK (`chunked_rule`: within a chunk the updates fold into
matrix products by the inverse of a unit lower-triangular system, inverted by blocks; an ONNX `Scan` carries the
state from chunk to chunk).

Padding is zeroed at the layer's input, as transformers does: a left-padded row's pads then leave the convolution's
window and the recurrent state at zero, so its real tokens see what they would unpadded; a right-padded row's pads
come after its real tokens, which a causal layer never reads.

The `generate` graph carries both states per row (`names.CONV_STATE` [batch, channels, conv_kernel − 1] and
`names.RECURRENT_STATE` [batch, value_heads, key_dim, value_dim], float32, zeros before a prompt); the `hidden` graph
starts from zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import numpy as np
import onnx
from onnx import TensorProto, helper

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder
from sie.worker.convert.names import (
    ATTENTION_MASK,
    CONV_STATE,
    CONV_STATE_SHAPE,
    INPUT_IDS,
    LINEAR_ATTENTION_LAYERS,
    RECURRENT_STATE,
    RECURRENT_STATE_SHAPE,
    past_state_name,
    present_state_name,
)

L2_EPSILON = 1e-6  # transformers' l2norm (the FLA library's)
CHUNK = 64  # tokens per chunk of a prompt's run (transformers' chunk_size)


class DecoderNodes(Protocol):
    """What the layer needs of the decoder graph being built (`decoder_graph._Decoder`): its builder, config, weights
    and shape, and the helpers every layer shares."""

    b: GraphBuilder
    config: Any  # DecoderConfig
    weights: Any  # DecoderWeights
    cached: bool  # the generate graph, with states in and out

    def sequence_shape(self, *widths: int) -> str: ...
    def norm_weight(self, name: str, size: int | None = None) -> np.ndarray: ...
    def rms_norm(self, x: str, scale: np.ndarray, name: str) -> str: ...
    def to_compute(self, x: str, name: str) -> str: ...
    def to_float(self, x: str, name: str) -> str: ...
    def weight(self, name: str, array: np.ndarray) -> str: ...
    def projection(self, x: str, name: str, out_features: int, in_features: int, bias: bool) -> str: ...
    def residual(self, x: str, out: str, name: str) -> str: ...


@attrs.frozen
class GatedDelta:
    """The linear-attention layers of a hybrid decoder and their sizes, in transformers' config names."""

    layers: tuple[int, ...]  # the indexes of the linear-attention layers; the others attend
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_width(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_width(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_channels(self) -> int:
        """The convolved channels: queries, keys and values side by side."""
        return 2 * self.key_width + self.value_width

    def conv_state_shape(self) -> tuple[int, int]:
        """A row's convolution state: its channels and the inputs the kernel still reads."""
        return self.conv_channels, self.conv_kernel - 1

    def recurrent_state_shape(self) -> tuple[int, int, int]:
        return self.num_value_heads, self.key_head_dim, self.value_head_dim

    def check(self, source: str) -> None:
        if self.num_value_heads % self.num_key_heads:
            raise ConversionError(f"{self.num_value_heads} linear-attention value heads do not group over "
                                  f"{self.num_key_heads} key heads", source=source)  # fmt: skip
        if self.conv_kernel < 2:
            raise ConversionError(f"linear_conv_kernel_dim {self.conv_kernel} is below 2", source=source)

    def to_json(self) -> dict[str, Any]:
        """What `config.json` keeps for the generation engine's cache: the layers and each row's two state shapes."""
        return {LINEAR_ATTENTION_LAYERS: list(self.layers), CONV_STATE_SHAPE: list(self.conv_state_shape()),
                RECURRENT_STATE_SHAPE: list(self.recurrent_state_shape())}  # fmt: skip


def state_inputs(spec: GatedDelta, layer: int, past: bool) -> list[onnx.ValueInfoProto]:
    """A linear-attention layer's two state inputs (`past`) or outputs of the generate graph."""
    named = past_state_name if past else present_state_name
    return [
        helper.make_tensor_value_info(named(layer, CONV_STATE), TensorProto.FLOAT, ["batch", *spec.conv_state_shape()]),
        helper.make_tensor_value_info(
            named(layer, RECURRENT_STATE), TensorProto.FLOAT, ["batch", *spec.recurrent_state_shape()]
        ),
    ]


def gated_delta_layer(decoder: DecoderNodes, x: str, layer: int, spec: GatedDelta, row_mask: str) -> str:
    """The layer's token mixer on the residual stream `x` ([B*S, hidden], float32), its residual added; `row_mask`
    ([B*S, 1], `row_mask`) zeroes the padding."""
    b, cfg = decoder.b, decoder.config
    name = f"model.layers.{layer}.linear_attn"
    weights = decoder.weights
    norm_name = f"model.layers.{layer}.input_layernorm"
    normed = decoder.rms_norm(x, decoder.norm_weight(f"{norm_name}.weight"), norm_name)
    normed = b.op("Mul", [normed, row_mask], f"{name}.unpadded")
    hidden = decoder.to_compute(normed, f"{name}.input")

    # One product for everything read from the input: q/k/v channels, the output gate z, then b and a per head.
    channels, heads, value_width = spec.conv_channels, spec.num_value_heads, spec.value_width
    parts = {"in_proj_qkv": channels, "in_proj_z": value_width, "in_proj_b": heads, "in_proj_a": heads}
    fused = np.concatenate(
        [weights.tensor(f"{name}.{part}.weight", (width, cfg.hidden_size)) for part, width in parts.items()]
    ).T
    projected = b.op("MatMul", [hidden, decoder.weight(f"{name}.in_proj", fused)], f"{name}.in_proj")
    projected = decoder.to_float(projected, f"{name}.in_proj_f32")
    mixed, gate, beta_in, decay_in = b.op_multi(
        "Split", [projected, b.const(list(parts.values()))],
        [f"{name}.qkv", f"{name}.z", f"{name}.b", f"{name}.a"], axis=1,
    )  # fmt: skip

    convolved = _causal_conv(decoder, mixed, layer, spec, name)  # [B, S, channels]
    query, key, value = b.op_multi(
        "Split", [convolved, b.const([spec.key_width, spec.key_width, value_width])],
        [f"{name}.q_raw", f"{name}.k_raw", f"{name}.v_raw"], axis=2,
    )  # fmt: skip
    query = _l2_normalised(decoder, query, spec, f"{name}.q", scale=spec.key_head_dim**-0.5)
    key = _l2_normalised(decoder, key, spec, f"{name}.k", scale=1.0)
    value = b.op("Reshape", [value, decoder.sequence_shape(heads, spec.value_head_dim)], f"{name}.v")

    beta = b.op("Sigmoid", [b.op("Reshape", [beta_in, decoder.sequence_shape(heads)], f"{name}.b_seq")],
                f"{name}.beta")  # fmt: skip
    a_log = weights.tensor(f"{name}.A_log", (heads,))
    dt_bias = weights.tensor(f"{name}.dt_bias", (heads,))
    per_head_a = b.op("Reshape", [decay_in, decoder.sequence_shape(heads)], f"{name}.a_seq")
    shifted = b.op("Add", [per_head_a, b.weight(f"{name}.dt_bias", dt_bias)], f"{name}.a_shifted")
    rate = b.op("Mul", [b.op("Softplus", [shifted], f"{name}.softplus"),
                        b.weight(f"{name}.neg_A", -np.exp(a_log.astype(np.float32)))], f"{name}.g")  # fmt: skip

    initial = past_state_name(layer, RECURRENT_STATE) if decoder.cached else _zero_state(decoder, spec, name)
    sequence = b.op("Squeeze", [b.op("Shape", [INPUT_IDS], f"{name}.s_1d", start=1, end=2), b.const([0])],
                    f"{name}.s")  # fmt: skip
    inputs = (query, key, value, rate, beta)
    final, outputs = b.op_multi(
        "If", [b.op("Greater", [sequence, b.const(1)], f"{name}.several")], [f"{name}.state", f"{name}.o"],
        then_branch=b.subgraph(f"{name}.chunked", [], lambda: chunked_rule(b, initial, inputs, spec, name)),
        else_branch=b.subgraph(f"{name}.single", [], lambda: single_step_rule(b, initial, inputs, name)),
    )  # fmt: skip
    if decoder.cached:
        b.op("Identity", [final], present_state_name(layer, RECURRENT_STATE))

    # RMSNorm over each head's values, times its weight, times SiLU(z)
    per_head = b.op("Reshape", [outputs, b.const([-1, spec.value_head_dim])], f"{name}.o_rows")
    norm_weight = weights.tensor(f"{name}.norm.weight", (spec.value_head_dim,))
    normed_out = decoder.rms_norm(per_head, norm_weight, f"{name}.norm")
    gate_rows = b.op("Reshape", [gate, b.const([-1, spec.value_head_dim])], f"{name}.z_rows")
    silu = b.op("Mul", [gate_rows, b.op("Sigmoid", [gate_rows], f"{name}.z_sigmoid")], f"{name}.z_silu")
    gated = b.op("Mul", [normed_out, silu], f"{name}.gated")
    merged = b.op("Reshape", [gated, b.const([-1, value_width])], f"{name}.merged")
    out = decoder.projection(decoder.to_compute(merged, f"{name}.merged_cast"), f"{name}.out_proj",
                              cfg.hidden_size, value_width, False)  # fmt: skip
    return decoder.residual(x, decoder.to_float(out, f"{name}.out_f32"), f"model.layers.{layer}.attn_residual")


def row_mask(b: GraphBuilder) -> str:
    """[B*S, 1] float32: 1 for this run's real tokens, 0 for padding (the attention mask's last S columns), read by
    every linear-attention layer."""
    sequence = b.op("Shape", [INPUT_IDS], "gated_delta.s", start=1, end=2)
    last = b.op("Slice", [ATTENTION_MASK, b.op("Neg", [sequence], "gated_delta.neg_s"),
                          b.const([np.iinfo(np.int64).max]), b.const([1])], "gated_delta.mask_last")  # fmt: skip
    rows = b.op("Reshape", [last, b.const([-1, 1])], "gated_delta.mask_rows")
    return b.op("Cast", [rows], "gated_delta.row_mask", to=TensorProto.FLOAT)


def _causal_conv(decoder: DecoderNodes, mixed: str, layer: int, spec: GatedDelta, name: str) -> str:
    """Depthwise causal convolution over the tokens then SiLU, [B*S, C] in, [B, S, C] out; the generate graph
    starts the window from the row's conv state and leaves its last `conv_kernel − 1` inputs as the next one."""
    b = decoder.b
    channels, kernel = spec.conv_channels, spec.conv_kernel
    weight = decoder.weights.tensor(f"{name}.conv1d.weight", (channels, 1, kernel))
    sequences = b.op("Reshape", [mixed, decoder.sequence_shape(channels)], f"{name}.qkv_seq")
    columns = b.op("Transpose", [sequences], f"{name}.qkv_t", perm=[0, 2, 1])  # [B, C, S]
    conv_weight = b.weight(f"{name}.conv1d.weight", weight)
    if decoder.cached:
        window = b.op("Concat", [past_state_name(layer, CONV_STATE), columns], f"{name}.conv_window", axis=2)
        b.op("Slice", [window, b.const([1 - kernel]), b.const([np.iinfo(np.int64).max]), b.const([2])],
             present_state_name(layer, CONV_STATE))  # fmt: skip
        convolved = b.op("Conv", [window, conv_weight], f"{name}.conv", group=channels, kernel_shape=[kernel])
    else:
        convolved = b.op("Conv", [columns, conv_weight], f"{name}.conv", group=channels, kernel_shape=[kernel],
                         pads=[kernel - 1, 0])  # fmt: skip
    activated = b.op("Mul", [convolved, b.op("Sigmoid", [convolved], f"{name}.conv_sigmoid")], f"{name}.conv_silu")
    return b.op("Transpose", [activated], f"{name}.conv_out", perm=[0, 2, 1])


def _l2_normalised(decoder: DecoderNodes, x: str, spec: GatedDelta, name: str, scale: float) -> str:
    """[B, S, key_heads * key_dim] → [B, S, value_heads, key_dim]: each head L2-normalised (times `scale`), repeated
    for the value heads it serves."""
    b = decoder.b
    heads = b.op("Reshape", [x, decoder.sequence_shape(spec.num_key_heads, spec.key_head_dim)], f"{name}_heads")
    squares = b.op("ReduceSum", [b.op("Mul", [heads, heads], f"{name}_sq"), b.const([-1])], f"{name}_sumsq",
                   keepdims=1)  # fmt: skip
    root = b.op("Sqrt", [b.op("Add", [squares, b.const(L2_EPSILON, np.float32)], f"{name}_eps")], f"{name}_norm")
    normed = b.op("Div", [heads, root], f"{name}_l2")
    if scale != 1.0:
        normed = b.op("Mul", [normed, b.const(scale, np.float32)], f"{name}_scaled")
    groups = spec.num_value_heads // spec.num_key_heads
    if groups == 1:
        return normed
    # repeat_interleave over the heads: key head h serves value heads h·groups … h·groups + groups − 1
    expanded = b.op("Unsqueeze", [normed, b.const([3])], f"{name}_5d")
    shape = b.op("Concat", [b.op("Shape", [expanded], f"{name}_shape", start=0, end=3),
                            b.const([groups, spec.key_head_dim])], f"{name}_repeat_shape", axis=0)  # fmt: skip
    repeated = b.op("Expand", [expanded, shape], f"{name}_repeated")
    return b.op("Reshape", [repeated, decoder.sequence_shape(spec.num_value_heads, spec.key_head_dim)],
                f"{name}_grouped")  # fmt: skip


def _zero_state(decoder: DecoderNodes, spec: GatedDelta, name: str) -> str:
    """[B, value_heads, key_dim, value_dim] zeros for the hidden graph's rows."""
    b = decoder.b
    rows = b.op("Shape", [INPUT_IDS], f"{name}.rows", start=0, end=1)
    shape = b.op("Concat", [rows, b.const(list(spec.recurrent_state_shape()))], f"{name}.state_shape", axis=0)
    return b.op("ConstantOfShape", [shape], f"{name}.state_zero",
                value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))  # fmt: skip


def _delta_step(b: GraphBuilder, state: str, token: Sequence[str], name: str) -> tuple[str, str]:
    """One token of the rule on its [B, H, …] query, key, value, log decay and beta: the new state [B, H, dk, dv] and
    the read [B, H, dv]."""
    query, key, value, rate, beta = token
    per_head = b.const([2, 3])
    decay = b.op("Exp", [b.op("Unsqueeze", [rate, per_head], f"{name}.rate_4d")], f"{name}.decay")
    decayed = b.op("Mul", [state, decay], f"{name}.decayed")
    key_row = b.op("Unsqueeze", [key, b.const([2])], f"{name}.k_row")  # [B, H, 1, dk]
    remembered = b.op("MatMul", [key_row, decayed], f"{name}.remembered")  # Sᵀk: [B, H, 1, dv]
    value_row = b.op("Unsqueeze", [value, b.const([2])], f"{name}.v_row")
    delta = b.op("Mul", [b.op("Sub", [value_row, remembered], f"{name}.error"),
                         b.op("Unsqueeze", [beta, per_head], f"{name}.beta_4d")], f"{name}.delta")  # fmt: skip
    key_column = b.op("Unsqueeze", [key, b.const([3])], f"{name}.k_column")  # [B, H, dk, 1]
    updated = b.op("Add", [decayed, b.op("MatMul", [key_column, delta], f"{name}.update")], f"{name}.updated")
    query_row = b.op("Unsqueeze", [query, b.const([2])], f"{name}.q_row")
    read = b.op("MatMul", [query_row, updated], f"{name}.read")  # [B, H, 1, dv]
    return updated, b.op("Squeeze", [read, b.const([2])], f"{name}.read_rows")


def single_step_rule(b: GraphBuilder, initial: str, inputs: Sequence[str], name: str) -> list[str]:
    """A run of one token (a decode step) of queries, keys, values, log decays and betas ([B, 1, H, …]) from the
    state `initial`: the rule once, no loop. Returns the new state and the read [B, 1, H, dv]."""
    sliced = [b.op("Squeeze", [x, b.const([1])], f"{name}.one.{index}") for index, x in enumerate(inputs)]
    state, read = _delta_step(b, initial, sliced, f"{name}.one")
    return [state, b.op("Unsqueeze", [read, b.const([1])], f"{name}.one.out")]


def chunked_rule(b: GraphBuilder, initial: str, inputs: Sequence[str], spec: GatedDelta, name: str) -> list[str]:
    """A run of several tokens (a prompt) of queries, keys, values, log decays and betas ([B, S, H, …]) from the
    state `initial`, as transformers' `torch_chunk_gated_delta_rule` computes it: the tokens in
    chunks of CHUNK (the last padded with tokens that change nothing: no key, no value, no decay), each chunk's
    updates folded into products by the inverse of its unit lower-triangular system (`_unit_lower_inverse`), then a
    Scan over the chunks carries the state. Returns the final state and the reads [B, S, H, dv]."""
    name = f"{name}.chunks"
    query, key, value, rate, beta = inputs
    sequence = b.op("Shape", [query], f"{name}.s", start=1, end=2)
    padding = b.op("Mod", [b.op("Sub", [b.const([CHUNK]), b.op("Mod", [sequence, b.const([CHUNK])], f"{name}.rem")],
                                f"{name}.short"), b.const([CHUNK])], f"{name}.pad")  # fmt: skip

    def chunked(x: str, part: str, width: int | None = None) -> str:
        """[B, S, H(, width)] → [B, H, N, CHUNK(, width)], the tokens padded to whole chunks with zeros."""
        rank = 3 if width is None else 4
        moved = b.op("Transpose", [x], f"{name}.{part}_t", perm=[0, 2, 1, 3][:rank])
        ends = [b.const([0] * (rank + 2)), padding] + ([b.const([0])] if width else [])
        padded = b.op("Pad", [moved, b.op("Concat", ends, f"{name}.{part}_pads", axis=0)], f"{name}.{part}_padded")
        shape = [0, 0, -1, CHUNK] + ([width] if width else [])
        return b.op("Reshape", [padded, b.const(shape)], f"{name}.{part}")

    q, k = chunked(query, "q", spec.key_head_dim), chunked(key, "k", spec.key_head_dim)
    v = chunked(value, "v", spec.value_head_dim)
    g, beta_c = chunked(rate, "g"), chunked(beta, "beta")
    beta_col = b.op("Unsqueeze", [beta_c, b.const([-1])], f"{name}.beta_col")
    v_beta = b.op("Mul", [v, beta_col], f"{name}.v_beta")
    k_beta = b.op("Mul", [k, beta_col], f"{name}.k_beta")
    cumulative = b.op("CumSum", [g, b.const(-1)], f"{name}.cum")  # [B, H, N, C]: log decay from the chunk's start
    cum_i = b.op("Unsqueeze", [cumulative, b.const([-1])], f"{name}.cum_i")
    growth = b.op("Exp", [cum_i], f"{name}.growth")
    # exp(cum_i − cum_j) where j ≤ i, else 0
    cum_j = b.op("Unsqueeze", [cumulative, b.const([-2])], f"{name}.cum_j")
    differences = b.op("Sub", [cum_i, cum_j], f"{name}.diff")
    causal = b.const(np.tril(np.ones((CHUNK, CHUNK), dtype=bool)), np.bool_)
    pairwise = b.op("Exp", [b.op("Where", [causal, differences, b.const(-np.inf, np.float32)], f"{name}.diff_masked")],
                    f"{name}.pairwise")  # fmt: skip
    k_t = b.op("Transpose", [k], f"{name}.k_tr", perm=[0, 1, 2, 4, 3])
    system = b.op("Mul", [b.op("MatMul", [k_beta, k_t], f"{name}.kk"), pairwise], f"{name}.system")
    strictly_lower = b.const(np.tril(np.ones((CHUNK, CHUNK), dtype=np.float32), -1), np.float32)
    identity = b.const(np.eye(CHUNK, dtype=np.float32), np.float32)
    unit_lower = b.op("Add", [identity, b.op("Mul", [system, strictly_lower], f"{name}.lower")], f"{name}.unit_lower")
    inverse = _unit_lower_inverse(b, unit_lower, f"{name}.inverse")
    new_values = b.op("MatMul", [inverse, v_beta], f"{name}.new_values")  # [B, H, N, C, dv]
    decayed_keys = b.op("MatMul", [inverse, b.op("Mul", [k_beta, growth], f"{name}.k_beta_grown")],
                        f"{name}.k_cumdecay")  # fmt: skip
    intra = b.op("Mul", [b.op("MatMul", [q, k_t], f"{name}.qk"), pairwise], f"{name}.intra")
    q_grown = b.op("Mul", [q, growth], f"{name}.q_grown")
    last = b.op("Slice", [cumulative, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([-1])],
                f"{name}.cum_last")  # fmt: skip
    k_to_end = b.op("Mul", [k, b.op("Exp", [b.op("Unsqueeze", [b.op("Sub", [last, cumulative], f"{name}.to_end"),
                                                               b.const([-1])], f"{name}.to_end_col")],
                                     f"{name}.to_end_exp")], f"{name}.k_to_end")  # fmt: skip
    chunk_decay = b.op("Exp", [last], f"{name}.chunk_decay")  # [B, H, N, 1]

    per_chunk = (new_values, decayed_keys, q_grown, intra, k_to_end, chunk_decay)
    final, reads = _across_chunks(b, initial, per_chunk, spec, name)
    dv = spec.value_head_dim
    flat = b.op("Reshape", [reads, b.const([0, 0, -1, dv])], f"{name}.reads_flat")  # [B, H, N*C, dv]
    cut = b.op("Slice", [flat, b.const([0]), sequence, b.const([2])], f"{name}.reads_cut")
    return [final, b.op("Transpose", [cut], f"{name}.out", perm=[0, 2, 1, 3])]


def _across_chunks(
    b: GraphBuilder, initial: str, per_chunk: Sequence[str], spec: GatedDelta, name: str
) -> tuple[str, str]:
    """The Scan over the chunks (axis 2 of each of `per_chunk`: the folded values, the decayed keys the state
    corrects, the grown queries, the intra-chunk attention, the keys decayed to the chunk's end, the chunk's decay):
    the final state and the reads [B, H, N, CHUNK, dv]."""
    heads, dk, dv = spec.recurrent_state_shape()
    parts = ("new_values", "k_cumdecay", "q", "intra", "k", "decay")
    state_in, *slices = (b.unique(f"{name}.scan.{part}_in") for part in ("state", *parts))
    body_inputs = [
        helper.make_tensor_value_info(state_in, TensorProto.FLOAT, ["batch", heads, dk, dv]),
        helper.make_tensor_value_info(slices[0], TensorProto.FLOAT, ["batch", heads, CHUNK, dv]),
        helper.make_tensor_value_info(slices[1], TensorProto.FLOAT, ["batch", heads, CHUNK, dk]),
        helper.make_tensor_value_info(slices[2], TensorProto.FLOAT, ["batch", heads, CHUNK, dk]),
        helper.make_tensor_value_info(slices[3], TensorProto.FLOAT, ["batch", heads, CHUNK, CHUNK]),
        helper.make_tensor_value_info(slices[4], TensorProto.FLOAT, ["batch", heads, CHUNK, dk]),
        helper.make_tensor_value_info(slices[5], TensorProto.FLOAT, ["batch", heads, 1]),
    ]

    def chunk_step() -> list[str]:
        values_i, cumdecay_i, q_i, intra_i, k_i, decay_i = slices
        step = f"{name}.scan"
        v_new = b.op("Sub", [values_i, b.op("MatMul", [cumdecay_i, state_in], f"{step}.predicted")], f"{step}.v_new")
        out = b.op("Add", [b.op("MatMul", [q_i, state_in], f"{step}.inter"),
                           b.op("MatMul", [intra_i, v_new], f"{step}.intra_read")], f"{step}.out")  # fmt: skip
        kept = b.op("Mul", [state_in, b.op("Unsqueeze", [decay_i, b.const([-1])], f"{step}.decay_4d")],
                    f"{step}.kept")  # fmt: skip
        written = b.op("MatMul", [b.op("Transpose", [k_i], f"{step}.k_t", perm=[0, 1, 3, 2]), v_new],
                       f"{step}.written")  # fmt: skip
        return [b.op("Add", [kept, written], f"{step}.state"), out]

    body = b.subgraph(f"{name}.step", body_inputs, chunk_step)
    final, reads = b.op_multi(
        "Scan", [initial, *per_chunk], [f"{name}.final", f"{name}.reads"], body=body, num_scan_inputs=len(per_chunk),
        scan_input_axes=[2] * len(per_chunk), scan_output_axes=[2],
    )  # fmt: skip
    return final, reads


def _unit_lower_inverse(b: GraphBuilder, matrix: str, name: str) -> str:
    """The inverse of unit lower-triangular [B, H, N, CHUNK, CHUNK] matrices, by blocks: the 2×2 diagonal blocks'
    are 2I − M; then each level pairs the inverses A⁻¹, B⁻¹ of two neighbouring diagonal blocks with the block X below
    the first into the inverse of their union, [[A⁻¹, 0], [−B⁻¹ X A⁻¹, B⁻¹]] (log₂ CHUNK levels of batched products,
    as stable as forward substitution)."""
    two = b.const(2 * np.eye(2, dtype=np.float32), np.float32)
    inverses = b.op("Sub", [two, _diagonal_blocks(b, matrix, 2, f"{name}.b1")], f"{name}.b2")  # [.., C/2, 2, 2]
    size = 2
    while size < CHUNK:
        pairs = CHUNK // (2 * size)
        level = f"{name}.b{size}"
        # −X: the block below each pair's first (rows (2p + 1)·size…, columns 2p·size…), negated
        grid = b.op("Reshape", [matrix, b.const([0, 0, 0, pairs, 2, size, pairs, 2, size])], f"{level}.grid")
        rows = b.op("Gather", [grid, b.const(1)], f"{level}.rows", axis=4)  # [.., p, size, q, 2, size]
        below = b.op("Gather", [rows, b.const(0)], f"{level}.below_all", axis=-2)  # [.., p, size, q, size]
        own = b.const(-np.eye(pairs, dtype=np.float32).reshape(pairs, 1, pairs, 1), np.float32)
        below = b.op("ReduceSum", [b.op("Mul", [below, own], f"{level}.own"), b.const([-2])], f"{level}.below",
                     keepdims=0)  # fmt: skip
        paired = b.op("Reshape", [inverses, b.const([0, 0, 0, pairs, 2, size, size])], f"{level}.paired")
        first = b.op("Gather", [paired, b.const(0)], f"{level}.first", axis=-3)
        second = b.op("Gather", [paired, b.const(1)], f"{level}.second", axis=-3)
        corner = b.op("MatMul", [b.op("MatMul", [second, below], f"{level}.bx"), first], f"{level}.corner")
        top = b.op("Pad", [first, b.const([0] * 11 + [size])], f"{level}.top")  # [A⁻¹, 0]
        bottom = b.op("Concat", [corner, second], f"{level}.bottom", axis=-1)
        inverses = b.op("Concat", [top, bottom], f"{level}.inverses", axis=-2)  # [.., pairs, 2·size, 2·size]
        size *= 2
    return b.op("Reshape", [inverses, b.const([0, 0, 0, CHUNK, CHUNK])], f"{name}.result")


def _diagonal_blocks(b: GraphBuilder, matrix: str, size: int, name: str) -> str:
    """The size × size blocks on the diagonal of [B, H, N, CHUNK, CHUNK] matrices: [B, H, N, CHUNK / size, size,
    size]."""
    count = CHUNK // size
    grid = b.op("Reshape", [matrix, b.const([0, 0, 0, count, size, count, size])], f"{name}.grid")
    own = b.const(np.eye(count, dtype=np.float32).reshape(count, 1, count, 1), np.float32)
    return b.op("ReduceSum", [b.op("Mul", [grid, own], f"{name}.own"), b.const([-2])], f"{name}.diagonal", keepdims=0)
