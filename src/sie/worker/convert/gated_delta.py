"""Qwen3.5's linear-attention layers (transformers' `Qwen3_5GatedDeltaNet`), as ONNX nodes the decoder graph adds in
place of attention: the gated delta rule, a recurrent state per value head that each token decays, corrects and
reads.

Per layer: one product gives the q/k/v channels, the output gate `z` and the per-head `b` and `a`; the q/k/v channels
pass a causal depthwise convolution (kernel `conv_kernel`) and SiLU; queries and keys are L2-normalised (queries also
scaled by 1/sqrt(key_dim)) and repeated over the value heads they serve; each token t then updates the head's state S
[key_dim, value_dim] as

    S ← S · exp(g_t);  S ← S + k_t ⊗ β_t (v_t − Sᵀk_t);  o_t = Sᵀq_t

with β = sigmoid(b) and g = −exp(A_log) · softplus(a + dt_bias), and the output is RMSNorm(o) · weight · SiLU(z),
projected back to the hidden size. The recurrence is an ONNX `Scan` over the run's tokens in float32 (transformers
runs the same rule chunked for a prompt and token by token with a cache; the two agree to rounding).

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
    INPUT_IDS,
    RECURRENT_STATE,
    past_state_name,
    present_state_name,
)

L2_EPSILON = 1e-6  # transformers' l2norm (the FLA library's)


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
        """transformers' names, as `config.json` keeps them for the generation engine's cache."""
        return {"linear_attention_layers": list(self.layers), "linear_num_key_heads": self.num_key_heads,
                "linear_num_value_heads": self.num_value_heads, "linear_key_head_dim": self.key_head_dim,
                "linear_value_head_dim": self.value_head_dim, "linear_conv_kernel_dim": self.conv_kernel}  # fmt: skip


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
    decay = b.op("Exp", [rate], f"{name}.decay")  # [B, S, value_heads]

    initial = past_state_name(layer, RECURRENT_STATE) if decoder.cached else _zero_state(decoder, spec, name)
    final, outputs = _recurrence(decoder, initial, (query, key, value, decay, beta), spec, name)
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


def _recurrence(
    decoder: DecoderNodes, initial: str, sequences: Sequence[str], spec: GatedDelta, name: str
) -> tuple[str, str]:
    """The gated delta rule token by token (an ONNX Scan over axis 1 of queries, keys, values, decays and betas):
    the final state [B, H, dk, dv] and the outputs [B, S, H, dv]."""
    b = decoder.b
    heads, dk, dv = spec.recurrent_state_shape()
    state_in, q_t, k_t, v_t, decay_t, beta_t = (f"{name}.step.{part}" for part in ("state_in", "q", "k", "v", "decay",
                                                                                   "beta"))  # fmt: skip
    step_inputs = [
        helper.make_tensor_value_info(state_in, TensorProto.FLOAT, ["batch", heads, dk, dv]),
        helper.make_tensor_value_info(q_t, TensorProto.FLOAT, ["batch", heads, dk]),
        helper.make_tensor_value_info(k_t, TensorProto.FLOAT, ["batch", heads, dk]),
        helper.make_tensor_value_info(v_t, TensorProto.FLOAT, ["batch", heads, dv]),
        helper.make_tensor_value_info(decay_t, TensorProto.FLOAT, ["batch", heads]),
        helper.make_tensor_value_info(beta_t, TensorProto.FLOAT, ["batch", heads]),
    ]

    def step() -> list[str]:
        per_head, step = b.const([2, 3]), f"{name}.step"
        decayed = b.op("Mul", [state_in, b.op("Unsqueeze", [decay_t, per_head], f"{step}.decay_4d")],
                       f"{step}.decayed")  # fmt: skip
        key_row = b.op("Unsqueeze", [k_t, b.const([2])], f"{step}.k_row")  # [B, H, 1, dk]
        remembered = b.op("MatMul", [key_row, decayed], f"{step}.remembered")  # Sᵀk: [B, H, 1, dv]
        value_row = b.op("Unsqueeze", [v_t, b.const([2])], f"{step}.v_row")
        delta = b.op("Mul", [b.op("Sub", [value_row, remembered], f"{step}.error"),
                             b.op("Unsqueeze", [beta_t, per_head], f"{step}.beta_4d")], f"{step}.delta")  # fmt: skip
        key_column = b.op("Unsqueeze", [k_t, b.const([3])], f"{step}.k_column")  # [B, H, dk, 1]
        state = b.op("Add", [decayed, b.op("MatMul", [key_column, delta], f"{step}.update")], f"{step}.state")
        query_row = b.op("Unsqueeze", [q_t, b.const([2])], f"{step}.q_row")
        read = b.op("MatMul", [query_row, state], f"{step}.read")  # [B, H, 1, dv]
        return [state, b.op("Squeeze", [read, b.const([2])], f"{step}.out")]

    body = b.subgraph(f"{name}.step", step_inputs, step)
    final, outputs = b.op_multi(
        "Scan", [initial, *sequences], [f"{name}.state", f"{name}.o"], body=body, num_scan_inputs=len(sequences),
        scan_input_axes=[1] * len(sequences), scan_output_axes=[1],
    )  # fmt: skip
    return final, outputs
