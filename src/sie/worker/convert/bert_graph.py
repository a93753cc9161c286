"""The BERT encoder as an opset-17 ONNX graph: embeddings, additive attention mask, transformer layers.

Heads live in `heads.py`; this module stops at the last hidden state. The layout lets onnxruntime's
own fusions apply at load time (MatMul + bias into Gemm, the erf pattern into Gelu).
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.bert_config import BertConfig
from sie.worker.convert.bert_weights import BertWeights
from sie.worker.convert.graph_builder import GraphBuilder, tensor_info

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
BATCH, SEQUENCE = "batch", "sequence"
# Added to the attention scores of padding keys; exp() of it is exactly 0 in float32, so padding
# never leaks, and it stays finite, so a row with no real tokens gives a uniform softmax, not NaN.
MASK_NEGATIVE = float(np.finfo(np.float32).min)


@attrs.frozen
class EncoderOutput:
    """Tensor names a head builds on."""

    hidden: str  # float [batch, sequence, hidden]
    tokens: str  # the same values as [batch * sequence, hidden]
    mask: str  # float [batch, sequence]: 1 for real tokens, 0 for padding
    padding_bias: str  # float [batch, sequence]: 0 for real tokens, MASK_NEGATIVE for padding
    word_embeddings: str  # the [vocab, hidden] table, reused by a tied MLM decoder


@attrs.frozen
class _Shapes:
    """Runtime shapes computed once from `input_ids` and shared by every layer."""

    sequence: str  # [S]
    batch_sequence: str  # [B, S]
    qkv_heads: str  # [-1, S, 3, heads, head_size]: the batch dimension is inferred


def graph_inputs() -> list[onnx.ValueInfoProto]:
    return [tensor_info(name, TensorProto.INT64, [BATCH, SEQUENCE]) for name in INPUT_NAMES]


def build_encoder(
    builder: GraphBuilder, config: BertConfig, weights: BertWeights, hidden_name: str = "last_hidden_state"
) -> EncoderOutput:
    """Add embeddings and every layer; the final [B,S,H] hidden state is named `hidden_name`.

    Between embeddings and output the hidden state is a [B*S, H] matrix, so onnxruntime turns
    every MatMul + bias Add into one Gemm.
    """
    shapes = _dynamic_shapes(builder, config)
    word_table, embedded = _embeddings(builder, config, weights, shapes.sequence)
    mask, padding_bias = _padding_bias(builder)
    attention_bias = builder.op("Unsqueeze", [padding_bias, builder.const([1, 2])], "mask.attention_bias")
    tokens = builder.op("Reshape", [embedded, builder.const([-1, config.hidden_size])], "embeddings.tokens")
    for index in range(config.num_hidden_layers):
        layer = _Layer(builder, config, weights, index, shapes)
        tokens = layer.feed_forward(layer.attention(tokens, attention_bias))
    hidden_shape = builder.op(
        "Concat", [shapes.batch_sequence, builder.const([config.hidden_size])], "shape.hidden", axis=0
    )
    hidden = builder.op("Reshape", [tokens, hidden_shape], hidden_name)
    return EncoderOutput(hidden=hidden, tokens=tokens, mask=mask, padding_bias=padding_bias, word_embeddings=word_table)


def _dynamic_shapes(builder: GraphBuilder, config: BertConfig) -> _Shapes:
    sequence = builder.op("Shape", ["input_ids"], "shape.sequence", start=1, end=2)
    per_head = builder.const([3, config.num_attention_heads, config.head_size])
    qkv_heads = builder.op("Concat", [builder.const([-1]), sequence, per_head], "shape.qkv_heads", axis=0)
    batch_sequence = builder.op("Shape", ["input_ids"], "shape.batch_sequence")
    return _Shapes(sequence=sequence, batch_sequence=batch_sequence, qkv_heads=qkv_heads)


def layer_norm(builder: GraphBuilder, x: str, params: tuple[np.ndarray, np.ndarray], name: str, eps: float) -> str:
    """LayerNormalization over the last axis; parameters are stored as `{name}.weight`/`.bias`."""
    scale = builder.weight(f"{name}.weight", params[0])
    bias = builder.weight(f"{name}.bias", params[1])
    return builder.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=eps)


def linear(builder: GraphBuilder, x: str, params: tuple[np.ndarray, np.ndarray], name: str, output: str = "") -> str:
    """`x @ W + b` as MatMul + Add; on a 2-D input onnxruntime fuses the pair into one Gemm."""
    product = builder.op("MatMul", [x, builder.weight(f"{name}.weight", params[0])], f"{name}.matmul")
    return builder.op("Add", [product, builder.weight(f"{name}.bias", params[1])], output or name)


def gelu(builder: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU, x * 0.5 * (1 + erf(x / sqrt 2)), spelled as onnxruntime's GeluFusion expects."""
    scaled = builder.op("Div", [x, builder.const(math.sqrt(2.0), np.float32)], f"{name}.div")
    erf = builder.op("Erf", [scaled], f"{name}.erf")
    shifted = builder.op("Add", [erf, builder.const(1.0, np.float32)], f"{name}.add")
    product = builder.op("Mul", [x, shifted], f"{name}.mul")
    return builder.op("Mul", [product, builder.const(0.5, np.float32)], name)


def _embeddings(builder: GraphBuilder, config: BertConfig, weights: BertWeights, sequence: str) -> tuple[str, str]:
    hidden = config.hidden_size
    word_table = builder.weight(
        "embeddings.word_embeddings.weight",
        weights.base("embeddings.word_embeddings.weight", (config.vocab_size, hidden)),
    )
    position_table = builder.weight(
        "embeddings.position_embeddings.weight",
        weights.base("embeddings.position_embeddings.weight", (config.max_position_embeddings, hidden)),
    )
    type_table = builder.weight(
        "embeddings.token_type_embeddings.weight",
        weights.base("embeddings.token_type_embeddings.weight", (config.type_vocab_size, hidden)),
    )
    words = builder.op("Gather", [word_table, "input_ids"], "embeddings.words")
    types = builder.op("Gather", [type_table, "token_type_ids"], "embeddings.types")
    # Positions are 0..S-1, so the first S rows of the table replace a Range + Gather.
    positions = builder.op(
        "Slice", [position_table, builder.const([0]), sequence, builder.const([0])], "embeddings.positions"
    )
    summed = builder.op("Add", [words, types], "embeddings.word_type")
    summed = builder.op("Add", [summed, positions], "embeddings.sum")
    params = weights.base_layer_norm("embeddings.LayerNorm", hidden)
    return word_table, layer_norm(builder, summed, params, "embeddings.LayerNorm", config.layer_norm_eps)


def _padding_bias(builder: GraphBuilder) -> tuple[str, str]:
    """The float mask [B,S] and the additive bias (1 - mask) * MASK_NEGATIVE, also [B,S]."""
    mask = builder.op("Cast", ["attention_mask"], "mask.float", to=TensorProto.FLOAT)
    inverted = builder.op("Sub", [builder.const(1.0, np.float32), mask], "mask.inverted")
    return mask, builder.op("Mul", [inverted, builder.const(MASK_NEGATIVE, np.float32)], "mask.padding_bias")


class _Layer:
    """One transformer layer's sub-graphs; weights are read as each block is built."""

    def __init__(
        self, builder: GraphBuilder, config: BertConfig, weights: BertWeights, index: int, shapes: _Shapes
    ) -> None:
        self.builder = builder
        self.config = config
        self.weights = weights
        self.shapes = shapes
        self.prefix = f"encoder.layer.{index}"

    def attention(self, x: str, attention_bias: str) -> str:
        """Self-attention on [B*S, H] tokens, then output dense, residual and LayerNorm."""
        b, cfg, name = self.builder, self.config, f"{self.prefix}.attention"
        qkv = linear(b, x, self._qkv_params(), f"{name}.self.qkv")
        # One Reshape + Transpose serves Q, K and V: [B*S,3H] -> [3,B,heads,S,head_size].
        split_heads = b.op("Reshape", [qkv, self.shapes.qkv_heads], f"{name}.self.heads")
        split_heads = b.op("Transpose", [split_heads], f"{name}.self.heads_t", perm=[2, 0, 3, 1, 4])
        parts = b.op_multi("Split", [split_heads], [f"{name}.self.{p}5d" for p in "qkv"], axis=0)
        q, k, v = (
            b.op("Squeeze", [part, b.const([0])], f"{name}.self.{p}") for part, p in zip(parts, "qkv", strict=True)
        )
        k_t = b.op("Transpose", [k], f"{name}.self.k_t", perm=[0, 1, 3, 2])
        scores = b.op("MatMul", [q, k_t], f"{name}.self.scores")
        scores = b.op("Add", [scores, attention_bias], f"{name}.self.masked_scores")
        probs = b.op("Softmax", [scores], f"{name}.self.probs", axis=-1)
        context = b.op("MatMul", [probs, v], f"{name}.self.context")
        context = b.op("Transpose", [context], f"{name}.self.context_t", perm=[0, 2, 1, 3])
        context = b.op("Reshape", [context, b.const([-1, cfg.hidden_size])], f"{name}.self.merged")
        out = linear(b, context, self._dense(f"{name}.output.dense", cfg.hidden_size), f"{name}.output.dense")
        return self._residual_norm(out, x, f"{name}.output.LayerNorm")

    def feed_forward(self, x: str) -> str:
        b, cfg, name = self.builder, self.config, f"{self.prefix}.intermediate.dense"
        inner = linear(b, x, self._dense(name, cfg.intermediate_size), name)
        activated = gelu(b, inner, f"{self.prefix}.intermediate.gelu")
        params = self.weights.base_linear(f"{self.prefix}.output.dense", cfg.intermediate_size, cfg.hidden_size)
        out = linear(b, activated, params, f"{self.prefix}.output.dense")
        return self._residual_norm(out, x, f"{self.prefix}.output.LayerNorm")

    def _qkv_params(self) -> tuple[np.ndarray, np.ndarray]:
        """Q, K and V side by side as one [H, 3H] matrix; 1/sqrt(head_size) is folded into Q."""
        width = self.config.hidden_size
        (wq, bq), (wk, bk), (wv, bv) = (
            self.weights.base_linear(f"{self.prefix}.attention.self.{part}", width, width)
            for part in ("query", "key", "value")
        )
        scale = np.float32(1.0 / math.sqrt(self.config.head_size))
        return np.concatenate([wq * scale, wk, wv], axis=1), np.concatenate([bq * scale, bk, bv])

    def _dense(self, name: str, out_features: int) -> tuple[np.ndarray, np.ndarray]:
        return self.weights.base_linear(name, self.config.hidden_size, out_features)

    def _residual_norm(self, out: str, residual: str, name: str) -> str:
        summed = self.builder.op("Add", [out, residual], f"{name}.residual")
        params = self.weights.base_layer_norm(name, self.config.hidden_size)
        return layer_norm(self.builder, summed, params, name, self.config.layer_norm_eps)
