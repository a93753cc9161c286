"""BART's sequence classifier (`BartForSequenceClassification`: facebook/bart-large-mnli and the other BART NLI
models that zero-shot classification serves), config + graph. BART is an encoder-decoder: the classifier runs the
encoder over the text and the decoder over the same ids shifted one place right (`decoder_start_token_id` first),
and classifies the decoder's hidden state at the last `eos_token_id` of each row (dense, tanh, `out_proj`).

Both stacks are post-LayerNorm transformers over learned positions that start at row 2 of their tables, with
embeddings (scaled by √d_model where `scale_embedding` says) LayerNorm-ed before the first layer. Encoder layers are
`encoder_graph`'s (fused attention under the padding mask, residual + LayerNorm); a decoder layer adds causal
self-attention (no padding mask: the classifier passes none, and right padding comes after every position it
reads) and cross-attention over the encoder under its padding mask.

Read from transformers' `modeling_bart.py` and checked against it on random checkpoints
(tests/integration/test_nli_classification.py). Only the sequence-classification head is built; another head, or
an option this graph does not build (another activation, a final or pre-layer LayerNorm), fails the conversion naming
it.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import (
    EncoderLayer,
    EncoderOutput,
    EncoderWeights,
    LayerShapes,
    layer_norm,
    layer_shapes,
    linear,
    padding_biases,
    residual_layer_norm,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import EncoderFamily, EncoderShape, check_heads, labels_of, positive_int
from sie.worker.convert.graph_builder import GraphBuilder

FAMILY: Final = EncoderFamily(
    "bart", ("bart",), "model.", layer="model.encoder.layers.{index}", query="self_attn.q_proj",
    key="self_attn.k_proj", value="self_attn.v_proj", attention_output="self_attn.out_proj",
    attention_norm="self_attn_layer_norm", ffn_in="fc1", ffn_out="fc2", ffn_norm="final_layer_norm",
    sequence_classifier="bart", mlm=None,
)  # fmt: skip
DECODER_FAMILY: Final = attrs.evolve(FAMILY, layer="model.decoder.layers.{index}")
HEADS_BUILT: Final = ("seq-cls",)
POSITION_OFFSET: Final = 2  # BartLearnedPositionalEmbedding: position p reads row p + 2
LAYER_NORM_EPS: Final = 1e-5  # torch's nn.LayerNorm default, which BART keeps
# The layout options of the BART family's configs (mBART's pre-LayerNorm layers and final LayerNorm are not built).
BUILT_LAYOUT: Final = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": True}


@attrs.frozen
class BartConfig(EncoderShape):
    """One BART checkpoint: the `EncoderShape` numbers are the encoder's; the decoder's beside them."""

    decoder_layers: int
    decoder_attention_heads: int
    decoder_ffn_dim: int
    eos_token_id: int
    decoder_start_token_id: int
    embed_scale: float
    layer_norm_eps: float = LAYER_NORM_EPS
    labels: tuple[str, ...] = ()
    gated_activation: str = ""  # what EncoderLayer asks: BART's feed-forward is not gated
    family: EncoderFamily = FAMILY

    def decoder_view(self) -> BartConfig:
        """The same config sized as the decoder, for the layer builder."""
        return attrs.evolve(self, num_attention_heads=self.decoder_attention_heads,
                            intermediate_size=self.decoder_ffn_dim, family=DECODER_FAMILY)  # fmt: skip


def parse_bart_config(raw: dict[str, Any], source: str) -> BartConfig:
    if raw.get("activation_function", "gelu") != "gelu":
        raise ConversionError(f"activation_function {raw['activation_function']!r} is not supported (only erf "
                              "'gelu')", source=source)  # fmt: skip
    for key, built in BUILT_LAYOUT.items():
        if raw.get(key, built) != built:
            raise ConversionError(f"{key} {raw[key]!r} is not supported (BART's post-LayerNorm layout only)",
                                  source=source)  # fmt: skip
    numbers = {key: positive_int(raw, key, source) for key in (
        "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
        "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings", "vocab_size", "eos_token_id",
    )}  # fmt: skip
    for heads in ("encoder_attention_heads", "decoder_attention_heads"):
        check_heads(numbers["d_model"], numbers[heads], source)
    start = raw.get("decoder_start_token_id", numbers["eos_token_id"])
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ConversionError(f"decoder_start_token_id {start!r} is not a token id", source=source)
    return BartConfig(
        hidden_size=numbers["d_model"],
        num_attention_heads=numbers["encoder_attention_heads"],
        num_hidden_layers=numbers["encoder_layers"],
        intermediate_size=numbers["encoder_ffn_dim"],
        max_position_embeddings=numbers["max_position_embeddings"],
        vocab_size=numbers["vocab_size"],
        decoder_layers=numbers["decoder_layers"],
        decoder_attention_heads=numbers["decoder_attention_heads"],
        decoder_ffn_dim=numbers["decoder_ffn_dim"],
        eos_token_id=numbers["eos_token_id"],
        decoder_start_token_id=start,
        embed_scale=math.sqrt(numbers["d_model"]) if raw.get("scale_embedding", False) else 1.0,
        labels=labels_of(raw.get("id2label"), source),
    )


def build_bart(builder: GraphBuilder, config: BartConfig, weights: EncoderWeights) -> EncoderOutput:
    """The encoder over `input_ids`, then the decoder over them shifted right; the output's hidden state is the
    decoder's, which the classifier reads at the last <eos> (`last_eos_rows`)."""
    b, width = builder, config.hidden_size
    shapes = layer_shapes(b, config)
    word_table = b.weight("model.shared.weight", _word_table(config, weights))
    mask, padding_bias = padding_biases(b)
    tokens = _embedded(b, config, weights, word_table, "input_ids", "model.encoder", shapes)
    for index in range(config.num_hidden_layers):
        layer = EncoderLayer(b, config, weights, index, shapes)
        tokens = layer.feed_forward(layer.attention(tokens, ""))
    key_bias = b.op("Unsqueeze", [padding_bias, b.const([1, 2])], "model.decoder.key_bias")  # [B, 1, 1, S]
    decoder = config.decoder_view()
    hidden = _embedded(b, config, weights, word_table, _shifted_right(b, config), "model.decoder", shapes)
    for index in range(config.decoder_layers):
        layer = EncoderLayer(b, decoder, weights, index, shapes)
        hidden = layer.attention(hidden, "", causal=True)
        hidden = _cross_attention(b, decoder, weights, index, hidden, tokens, key_bias, shapes)
        hidden = layer.feed_forward(hidden)
    hidden_shape = b.op("Concat", [shapes.batch_sequence, b.const([width])], "shape.hidden", axis=0)
    output = b.op("Reshape", [hidden, hidden_shape], "last_hidden_state")
    return EncoderOutput(hidden=output, tokens=hidden, mask=mask, padding_bias=padding_bias, word_embeddings=word_table)


def last_eos_rows(builder: GraphBuilder, config: BartConfig, hidden: str) -> str:
    """[B, H]: each row's hidden state at its last `eos_token_id` (where BartForSequenceClassification reads it)."""
    b = builder
    is_eos = b.op("Cast", [b.op("Equal", ["input_ids", b.const(config.eos_token_id)], "eos.is")], "eos.int",
                  to=TensorProto.INT64)  # fmt: skip
    ones = b.op("Add", [b.op("Mul", ["input_ids", b.const(0)], "eos.zeros"), b.const(1)], "eos.ones")
    numbered = b.op("Mul", [is_eos, b.op("CumSum", [ones, b.const(1)], "eos.positions")], "eos.numbered")
    last = b.op("Sub", [b.op("ReduceMax", [numbered], "eos.last1", axes=[1], keepdims=1), b.const(1)], "eos.last")
    batch = b.op("Shape", [hidden], "eos.batch", start=0, end=1)
    index_shape = b.op("Concat", [batch, b.const([1, config.hidden_size])], "eos.index_shape", axis=0)
    index = b.op("Expand", [b.op("Unsqueeze", [last, b.const([2])], "eos.index3"), index_shape], "eos.index")
    rows = b.op("GatherElements", [hidden, index], "eos.rows", axis=1)
    return b.op("Squeeze", [rows, b.const([1])], "eos.hidden")


def _word_table(config: BartConfig, weights: EncoderWeights) -> np.ndarray:
    shape = (config.vocab_size, config.hidden_size)
    for name in ("model.shared.weight", "model.encoder.embed_tokens.weight"):
        if weights.has(name):
            return weights.get(name, shape)
    raise ConversionError("required tensor is missing", source=weights.source, tensor="model.shared.weight")


def _embedded(  # noqa: PLR0913 - one stack's embedding inputs
    b: GraphBuilder,
    config: BartConfig,
    weights: EncoderWeights,
    word_table: str,
    ids: str,
    stack: str,
    shapes: LayerShapes,
) -> str:
    """[B*S, H]: the words (scaled) plus the learned positions from row 2, LayerNorm-ed (`layernorm_embedding`)."""
    rows = config.max_position_embeddings + POSITION_OFFSET
    table = b.weight(f"{stack}.embed_positions.weight",
                     weights.get(f"{stack}.embed_positions.weight", (rows, config.hidden_size)))  # fmt: skip
    words = b.op("Gather", [word_table, ids], f"{stack}.words")
    if config.embed_scale != 1.0:
        words = b.op("Mul", [words, b.const(config.embed_scale, np.float32)], f"{stack}.scaled")
    end = b.op("Add", [shapes.sequence, b.const([POSITION_OFFSET])], f"{stack}.positions_end")
    positions = b.op("Slice", [table, b.const([POSITION_OFFSET]), end, b.const([0])], f"{stack}.positions")
    summed = b.op("Add", [words, positions], f"{stack}.embedded")
    params = weights.layer_norm(f"{stack}.layernorm_embedding", config.hidden_size)
    normed = layer_norm(b, summed, params, f"{stack}.layernorm_embedding", config.layer_norm_eps)
    return b.op("Reshape", [normed, b.const([-1, config.hidden_size])], f"{stack}.tokens")


def _shifted_right(b: GraphBuilder, config: BartConfig) -> str:
    """The decoder's ids: `decoder_start_token_id`, then `input_ids` but the last (transformers' shift_tokens_right)."""
    first = b.op("Slice", ["input_ids", b.const([0]), b.const([1]), b.const([1])], "decoder.first")
    start = b.op("Add", [b.op("Mul", [first, b.const(0)], "decoder.zero"), b.const(config.decoder_start_token_id)],
                 "decoder.start")  # fmt: skip
    rest = b.op("Slice", ["input_ids", b.const([0]), b.const([-1]), b.const([1])], "decoder.rest")
    return b.op("Concat", [start, rest], "decoder_input_ids", axis=1)


def _heads(b: GraphBuilder, tokens: str, heads: int, width: int, shapes: LayerShapes, name: str) -> str:
    """[B*S, H] tokens as [B, heads, S, head size]."""
    shape = b.op("Concat", [shapes.batch_sequence, b.const([heads, width // heads])], f"{name}.shape", axis=0)
    split = b.op("Reshape", [tokens, shape], f"{name}.split")
    return b.op("Transpose", [split], name, perm=[0, 2, 1, 3])


def _cross_attention(  # noqa: PLR0913 - one layer's inputs
    b: GraphBuilder,
    config: BartConfig,
    weights: EncoderWeights,
    index: int,
    x: str,
    encoder_tokens: str,
    key_bias: str,
    shapes: LayerShapes,
) -> str:
    """Attention of the decoder tokens over the encoder's output tokens ([B*S, H]) under its padding mask, the output
    projection, the residual and `encoder_attn_layer_norm`."""
    width, heads = config.hidden_size, config.num_attention_heads
    prefix = f"{config.family.layer.format(index=index)}.encoder_attn"

    def projected(source: str, part: str) -> str:
        params = weights.linear(f"{prefix}.{part}", width, width)
        return _heads(b, linear(b, source, params, f"{prefix}.{part}"), heads, width, shapes, f"{prefix}.{part}.heads")

    query = projected(x, "q_proj")
    key, value = projected(encoder_tokens, "k_proj"), projected(encoder_tokens, "v_proj")
    keys_t = b.op("Transpose", [key], f"{prefix}.keys_t", perm=[0, 1, 3, 2])
    scores = b.op("MatMul", [query, keys_t], f"{prefix}.scores")
    scores = b.op("Mul", [scores, b.const(1.0 / math.sqrt(width // heads), np.float32)], f"{prefix}.scaled")
    probs = b.op("Softmax", [b.op("Add", [scores, key_bias], f"{prefix}.masked")], f"{prefix}.probs", axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, value], f"{prefix}.context4")], f"{prefix}.context_t",
                   perm=[0, 2, 1, 3])  # fmt: skip
    context = b.op("Reshape", [context, b.const([-1, width])], f"{prefix}.context")
    out = linear(b, context, weights.linear(f"{prefix}.out_proj", width, width), f"{prefix}.out_proj")
    params = weights.layer_norm(f"{prefix}_layer_norm", width)
    return residual_layer_norm(b, out, x, params, f"{prefix}_layer_norm", config.layer_norm_eps)
