"""The ModernBERT encoder family, config + graph: pre-LayerNorm layers without biases (unless the config asks),
rotary position embeddings with one base for global layers and another for local ones, local layers that attend
only within a window (`|query - key| <= local_attention // 2`), a gated GELU feed-forward (`Wi` gives input and
gate), a final LayerNorm; and its task heads (`head`: dense, activation, LayerNorm; then `classifier` or the tied
`decoder`).

Read from transformers' `modeling_modernbert.py` and `configuration_modernbert.py`; both config layouts are read:
the Hub's (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`) and transformers 5's
(`layer_types`, `rope_parameters`). Checked against transformers itself (tests/unit/test_convert_families.py).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import (
    MASK_NEGATIVE,
    EncoderOutput,
    EncoderWeights,
    gelu,
    layer_norm,
    linear,
    padding_biases,
    rows_of,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import (
    SUPPORTED_ACTIVATIONS,
    EncoderFamily,
    EncoderShape,
    MlmHead,
    labels_of,
    positive_int,
    shape_numbers,
)
from sie.worker.convert.graph_builder import GraphBuilder
from sie.worker.convert.rotary import (
    inverse_frequencies,
    qkv_heads_shape,
    rotary_attention,
    rotary_rows_attention,
    rotary_tables,
)

FAMILY = EncoderFamily(
    "modernbert", ("modernbert",), "model.", layer="layers.{index}", query="", key="", value="",
    attention_output="attn.Wo", attention_norm="attn_norm", ffn_in="mlp.Wi", ffn_out="mlp.Wo", ffn_norm="mlp_norm",
    sequence_classifier="modernbert",
    mlm=MlmHead("head.dense", "head.norm", "decoder.weight", ("decoder.bias",), "embeddings.tok_embeddings.weight"),
)  # fmt: skip
FULL, SLIDING = "full_attention", "sliding_attention"
DEFAULT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}


@attrs.frozen
class ModernBertConfig(EncoderShape):
    """The architecture of one ModernBERT checkpoint; the heads read the same fields of it as of `EncoderConfig`."""

    layer_types: tuple[str, ...]
    rope_theta: dict[str, float]
    local_attention: int = 128
    layer_norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    classifier_pooling: str = "cls"
    classifier_bias: bool = False
    decoder_bias: bool = True
    labels: tuple[str, ...] = ()
    family: EncoderFamily = FAMILY
    type_vocab_size: int = 0


def parse_modernbert_config(raw: dict[str, Any], source: str) -> ModernBertConfig:
    numbers = shape_numbers(raw, source)
    for key in ("hidden_activation", "classifier_activation"):
        if raw.get(key, "gelu") not in SUPPORTED_ACTIVATIONS:
            raise ConversionError(f"{key} {raw.get(key)!r} is not supported (only erf 'gelu')", source=source)
    layers = numbers["num_hidden_layers"]
    layer_types = raw.get("layer_types")
    if layer_types is None:
        every = positive_int(raw, "global_attn_every_n_layers", source) if "global_attn_every_n_layers" in raw else 3
        layer_types = [SLIDING if index % every else FULL for index in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers or not set(layer_types) <= {FULL, SLIDING}:
        raise ConversionError(
            f"layer_types {layer_types!r} is not one of {FULL!r}/{SLIDING!r} per layer", source=source
        )
    rope = raw.get("rope_parameters") or {}
    theta = {
        FULL: (rope.get(FULL) or {}).get("rope_theta", raw.get("global_rope_theta", DEFAULT_THETA[FULL])),
        SLIDING: (rope.get(SLIDING) or {}).get("rope_theta", raw.get("local_rope_theta", DEFAULT_THETA[SLIDING])),
    }
    for kind in (FULL, SLIDING):
        rope_type = (rope.get(kind) or {}).get("rope_type", "default")
        if rope_type != "default" or raw.get("rope_scaling"):
            raise ConversionError(
                f"rope type {rope_type!r} / rope_scaling is not supported (default only)", source=source
            )
    pooling = raw.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise ConversionError(f"classifier_pooling {pooling!r} is not 'cls' or 'mean'", source=source)
    return ModernBertConfig(
        **numbers,
        layer_types=tuple(layer_types),
        rope_theta={kind: float(value) for kind, value in theta.items()},
        local_attention=positive_int(raw, "local_attention", source) if "local_attention" in raw else 128,
        layer_norm_eps=float(raw.get("norm_eps", 1e-5)),
        norm_bias=bool(raw.get("norm_bias", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        classifier_pooling=pooling,
        classifier_bias=bool(raw.get("classifier_bias", False)),
        decoder_bias=bool(raw.get("decoder_bias", True)),
        labels=labels_of(raw.get("id2label"), source),
    )


def build_modernbert(
    builder: GraphBuilder, config: ModernBertConfig, weights: EncoderWeights, *, rows: str = ""
) -> EncoderOutput:
    """Embeddings, every layer and the final norm; the [B,S,H] output is `last_hidden_state`. `rows` (int64 [B, P]
    positions the head reads alone, as `build_encoder` takes them): the last layer is computed at those positions
    only (their queries against every token's keys and values, a sliding layer's window rows of them), and the
    output is [B,P,H]."""
    b, cfg, width = builder, config, config.hidden_size
    base = weights.prefix
    word_table = b.weight(
        "embeddings.tok_embeddings.weight", weights.base("embeddings.tok_embeddings.weight", (cfg.vocab_size, width))
    )
    embedded = b.op("Gather", [word_table, "input_ids"], "embeddings.words")
    embedded = layer_norm(b, embedded, weights.layer_norm(f"{base}embeddings.norm", width, cfg.norm_bias),
                          "embeddings.norm", cfg.layer_norm_eps)  # fmt: skip
    mask, padding_bias = padding_biases(b)
    full_bias = b.op("Unsqueeze", [padding_bias, b.const([1, 2])], "mask.full")  # [B,1,1,S]
    sequence = b.op("Shape", ["input_ids"], "shape.sequence", start=1, end=2)
    length = b.op("Squeeze", [sequence, b.const([0])], "shape.length")
    steps = b.op("Range", [b.const(0), length, b.const(1)], "shape.steps")
    shared = _Shared(
        heads_shape=qkv_heads_shape(b, cfg.num_attention_heads, cfg.head_size),
        biases={FULL: full_bias, SLIDING: _window_bias(b, cfg, full_bias, steps)},
        rotary={
            kind: rotary_tables(b, steps, inverse_frequencies(cfg.head_size, cfg.rope_theta[kind]), f"rope.{kind}")
            for kind in set(cfg.layer_types)
        },
    )
    layers = _Layers(b, cfg, weights, shared)
    tokens = b.op("Reshape", [embedded, b.const([-1, width])], "embeddings.tokens")
    last = len(cfg.layer_types) - 1
    for index, kind in enumerate(cfg.layer_types):
        prefix = f"{base}layers.{index}"
        normed = tokens
        if index:  # the first layer's attention norm is the identity (the embeddings were just normed)
            normed = layer_norm(b, tokens, weights.layer_norm(f"{prefix}.attn_norm", width, cfg.norm_bias),
                                f"{prefix}.attn_norm", cfg.layer_norm_eps)  # fmt: skip
        if rows and index == last:
            tokens = b.op("Reshape", [rows_of(b, tokens, rows, f"{prefix}.residual"), b.const([-1, width])],
                          f"{prefix}.residual_rows")  # fmt: skip
            attended = layers.rows_attention(prefix, normed, rows, kind)
        else:
            attended = layers.attention(prefix, normed, kind)
        tokens = b.op("Add", [tokens, attended], f"{prefix}.attn.residual")
        normed = layer_norm(b, tokens, weights.layer_norm(f"{prefix}.mlp_norm", width, cfg.norm_bias),
                            f"{prefix}.mlp_norm", cfg.layer_norm_eps)  # fmt: skip
        tokens = b.op("Add", [tokens, layers.gated_mlp(prefix, normed)], f"{prefix}.mlp.residual")
    tokens = layer_norm(b, tokens, weights.layer_norm(f"{base}final_norm", width, cfg.norm_bias), "final_norm",
                        cfg.layer_norm_eps)  # fmt: skip
    batch_sequence = b.op("Shape", [rows or "input_ids"], "shape.batch_sequence")
    hidden_shape = b.op("Concat", [batch_sequence, b.const([width])], "shape.hidden", axis=0)
    hidden = b.op("Reshape", [tokens, hidden_shape], "last_hidden_state")
    return EncoderOutput(hidden=hidden, tokens=tokens, mask=mask, padding_bias=padding_bias, word_embeddings=word_table)


def _window_bias(b: GraphBuilder, cfg: ModernBertConfig, full_bias: str, steps: str) -> str:
    """The padding bias plus MASK_NEGATIVE wherever |query - key| > local_attention // 2: [B,1,S,S]."""
    keys = b.op("Unsqueeze", [steps, b.const([0])], "window.keys")
    queries = b.op("Unsqueeze", [steps, b.const([1])], "window.queries")
    distance = b.op("Abs", [b.op("Sub", [keys, queries], "window.offset")], "window.distance")
    outside = b.op("Greater", [distance, b.const(cfg.local_attention // 2)], "window.outside")
    outside = b.op("Cast", [outside], "window.outside_float", to=TensorProto.FLOAT)
    window = b.op("Mul", [outside, b.const(MASK_NEGATIVE, np.float32)], "window.bias")  # [S,S]
    # MASK_NEGATIVE twice would overflow to -inf (a row with nothing left would give NaN): take the minimum.
    return b.op("Min", [full_bias, window], "mask.sliding")


@attrs.frozen
class _Shared:
    """Tensors every layer reads: the projections' shapes, and per kind of layer its attention bias and rotary
    cos/sin."""

    heads_shape: tuple[str, str]  # `qkv_heads_shape`'s
    biases: dict[str, str]
    rotary: dict[str, tuple[str, str]]


class _Layers:
    """Builds each layer's attention and gated MLP over the shared tensors."""

    def __init__(
        self, builder: GraphBuilder, config: ModernBertConfig, weights: EncoderWeights, shared: _Shared
    ) -> None:
        self.b, self.cfg, self.weights, self.shared = builder, config, weights, shared

    def attention(self, prefix: str, x: str, kind: str) -> str:
        cfg, width, shared = self.cfg, self.cfg.hidden_size, self.shared
        qkv = self.weights.linear(f"{prefix}.attn.Wqkv", width, 3 * width, cfg.attention_bias)
        out = self.weights.linear(f"{prefix}.attn.Wo", width, width, cfg.attention_bias)
        return rotary_attention(self.b, x, qkv, out, shared.heads_shape, shared.rotary[kind], shared.biases[kind],
                                cfg.head_size, f"{prefix}.attn")  # fmt: skip

    def rows_attention(self, prefix: str, x: str, rows: str, kind: str) -> str:
        """`attention` for the queries at `rows` alone: [B*P, H] out."""
        b, cfg, width, shared = self.b, self.cfg, self.cfg.hidden_size, self.shared
        qkv = self.weights.linear(f"{prefix}.attn.Wqkv", width, 3 * width, cfg.attention_bias)
        out = self.weights.linear(f"{prefix}.attn.Wo", width, width, cfg.attention_bias)
        bias = shared.biases[kind]  # [B, 1, 1, S], or a sliding layer's [B, 1, S, S]: the queries' rows of it
        if kind == SLIDING:
            keys = b.op("Shape", [bias], f"{prefix}.keys", start=3)
            index_shape = b.op("Concat", [b.op("Shape", [rows], f"{prefix}.rows_shape"), keys],
                               f"{prefix}.bias_rows_shape", axis=0)  # fmt: skip
            index = b.op("Expand", [b.op("Unsqueeze", [rows, b.const([2])], f"{prefix}.rows_3d"), index_shape],
                         f"{prefix}.bias_index")  # fmt: skip
            index = b.op("Unsqueeze", [index, b.const([1])], f"{prefix}.bias_index_4d")
            bias = b.op("GatherElements", [bias, index], f"{prefix}.bias_rows", axis=2)
        selected = b.op("Reshape", [rows_of(b, x, rows, f"{prefix}.attn"), b.const([-1, width])], f"{prefix}.selected")
        return rotary_rows_attention(b, x, selected, rows, qkv, out, shared.rotary[kind], bias, cfg.head_size,
                                     f"{prefix}.attn")  # fmt: skip

    def gated_mlp(self, prefix: str, x: str) -> str:
        """`Wo(gelu(input) * gate)`, input and gate the two halves of `Wi(x)` (two products: no split of the
        activations)."""
        b, cfg, inner = self.b, self.cfg, self.cfg.intermediate_size
        weight, bias = self.weights.linear(f"{prefix}.mlp.Wi", cfg.hidden_size, 2 * inner, cfg.mlp_bias)
        value = linear(b, x, (weight[:, :inner], bias[:inner]), f"{prefix}.mlp.input")
        gate = linear(b, x, (weight[:, inner:], bias[inner:]), f"{prefix}.mlp.gate")
        gated = b.op("Mul", [gelu(b, value, f"{prefix}.mlp.gelu"), gate], f"{prefix}.mlp.gated")
        out = self.weights.linear(f"{prefix}.mlp.Wo", inner, cfg.hidden_size, cfg.mlp_bias)
        return linear(b, gated, out, f"{prefix}.mlp.Wo")
