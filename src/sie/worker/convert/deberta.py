"""The DeBERTa-v2/v3 encoder family (the backbone of GLiNER, GLiClass and the NLI zero-shot models), config + graph:
BERT's post-LayerNorm layers with disentangled attention instead of absolute positions. Each layer's scores are
content-to-content (Q·K) plus content-to-position (Q against the keys of the relative-position embeddings, read at
the bucket of query − key) plus position-to-content (K against their queries, read at the bucket of key − query),
all scaled by 1/sqrt(3 · head_size); the relative-position embeddings are LayerNorm-ed once and projected by every
layer's own query and key projections (`share_att_key`). Relative distances map to `position_buckets` log buckets
up to `max_relative_positions`.

Read from transformers' `modeling_deberta_v2.py` (`make_log_bucket_position`, `DisentangledSelfAttention`) and
checked against it on random checkpoints (tests/integration/test_deberta.py). What this graph does not build (no
`relative_attention`, attention keys not shared, the convolution layer of deberta-v2-xlarge, other
`pos_att_type`s) fails the conversion naming it.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import (
    EncoderOutput,
    EncoderWeights,
    gelu,
    layer_norm,
    linear,
    padding_biases,
    row_heads,
    rows_of,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import EncoderFamily, EncoderShape, labels_of, positive_int, shape_numbers
from sie.worker.convert.graph_builder import GraphBuilder

FAMILY = EncoderFamily(
    "deberta-v2", ("deberta-v2",), "deberta.", layer="encoder.layer.{index}", query="attention.self.query_proj",
    key="attention.self.key_proj", value="attention.self.value_proj", attention_output="attention.output.dense",
    attention_norm="attention.output.LayerNorm", ffn_in="intermediate.dense", ffn_out="output.dense",
    ffn_norm="output.LayerNorm", sequence_classifier="deberta", mlm=None,
)  # fmt: skip
# Distances tabulated for the bucket lookup: sequences up to this many tokens.
MAX_DISTANCE = 8192


@attrs.frozen
class DebertaConfig(EncoderShape):
    """The architecture of one DeBERTa-v2/v3 checkpoint."""

    position_buckets: int
    max_relative_positions: int
    type_vocab_size: int = 0
    position_biased_input: bool = False
    embedding_size: int = 0  # 0: the hidden size
    layer_norm_eps: float = 1e-7
    labels: tuple[str, ...] = ()
    family: EncoderFamily = FAMILY

    @property
    def span(self) -> int:
        """Relative positions each side: the bucket count, or the distance limit without buckets."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions


def parse_deberta_config(raw: dict[str, Any], source: str) -> DebertaConfig:
    numbers = shape_numbers(raw, source)
    _check_built(raw, numbers["hidden_size"], source)
    max_relative = raw.get("max_relative_positions", -1)
    if not isinstance(max_relative, int) or max_relative < 1:
        max_relative = numbers["max_position_embeddings"]
    buckets = raw.get("position_buckets", -1)
    embedding_size = raw.get("embedding_size") or numbers["hidden_size"]
    return DebertaConfig(
        **numbers,
        position_buckets=buckets if isinstance(buckets, int) and buckets > 0 else -1,
        max_relative_positions=max_relative,
        type_vocab_size=int(raw.get("type_vocab_size", 0) or 0),
        position_biased_input=bool(raw.get("position_biased_input", True)),
        embedding_size=positive_int({"embedding_size": embedding_size}, "embedding_size", source),
        layer_norm_eps=float(raw.get("layer_norm_eps", 1e-7)),
        labels=labels_of(raw.get("id2label"), source),
    )


def _check_built(raw: dict[str, Any], hidden: int, source: str) -> None:
    """ConversionError naming the first option this graph does not build."""
    for key in ("hidden_act", "pooler_hidden_act"):
        if raw.get(key, "gelu") != "gelu":
            raise ConversionError(f"{key} {raw.get(key)!r} is not supported (only erf 'gelu')", source=source)
    if raw.get("pooler_hidden_size", hidden) != hidden:
        raise ConversionError("a pooler narrower or wider than the hidden size is not supported", source=source)
    if not raw.get("relative_attention", False):
        raise ConversionError("a DeBERTa without relative_attention is not supported", source=source)
    if not raw.get("share_att_key", False):
        raise ConversionError("a DeBERTa whose attention keys are not shared (share_att_key) is not supported",
                              source=source)  # fmt: skip
    if raw.get("conv_kernel_size", 0):
        raise ConversionError("DeBERTa's convolution layer (conv_kernel_size) is not supported", source=source)
    pos_att_type = raw.get("pos_att_type") or []
    if isinstance(pos_att_type, str):
        pos_att_type = [part.strip() for part in pos_att_type.lower().split("|")]
    if sorted(pos_att_type) != ["c2p", "p2c"]:
        raise ConversionError(f"pos_att_type {pos_att_type!r} is not supported; expected c2p and p2c", source=source)
    if "layer_norm" not in [part.strip() for part in str(raw.get("norm_rel_ebd", "none")).lower().split("|")]:
        raise ConversionError("relative embeddings without their LayerNorm (norm_rel_ebd) are not supported",
                              source=source)  # fmt: skip


def relative_buckets(config: DebertaConfig) -> np.ndarray:
    """The bucket of each distance -(MAX_DISTANCE-1) … MAX_DISTANCE-1 (index = distance + MAX_DISTANCE - 1), as
    `make_log_bucket_position` computes it (float32, as torch does)."""
    distance = np.arange(-(MAX_DISTANCE - 1), MAX_DISTANCE, dtype=np.int64)
    if config.position_buckets <= 0:
        return distance
    mid = config.position_buckets // 2
    sign = np.sign(distance)
    near = (distance < mid) & (distance > -mid)
    absolute = np.where(near, mid - 1, np.abs(distance))
    ratio = (absolute.astype(np.float32) / np.float32(mid)).astype(np.float32)
    scale = np.log(np.float32((config.max_relative_positions - 1) / mid)).astype(np.float32)
    log_pos = np.ceil(np.log(ratio) / scale * np.float32(mid - 1)) + np.float32(mid)
    return np.where(absolute <= mid, distance, (log_pos * sign).astype(np.int64)).astype(np.int64)


def build_deberta(
    builder: GraphBuilder, config: DebertaConfig, weights: EncoderWeights, *, rows: str = ""
) -> EncoderOutput:
    """Embeddings and every layer; the final [B,S,H] hidden state is `last_hidden_state`. `rows` (int64 [B, P]
    positions the head reads alone, as `build_encoder` takes them): the last layer is computed at those positions
    only, and the hidden state is [B,P,H]."""
    b, hidden = builder, config.hidden_size
    mask, padding_bias = padding_biases(b)
    words = weights.base("embeddings.word_embeddings.weight", (config.vocab_size, config.embedding_size))
    table = b.weight("embeddings.word_embeddings.weight", words)
    x = b.op("Gather", [table, "input_ids"], "embeddings.words")
    sequence = b.op("Shape", ["input_ids"], "shape.sequence", start=1, end=2)
    if config.position_biased_input:
        positions = weights.base("embeddings.position_embeddings.weight",
                                 (config.max_position_embeddings, config.embedding_size))  # fmt: skip
        steps = b.op("Range", [b.const(0), b.op("Squeeze", [sequence, b.const([0])], "shape.s"), b.const(1)], "steps")
        x = b.op("Add", [x, b.op("Gather", [b.weight("embeddings.position_embeddings.weight", positions), steps],
                                 "embeddings.positions")], "embeddings.with_positions")  # fmt: skip
    if config.type_vocab_size:
        name = "embeddings.token_type_embeddings.weight"
        types = b.weight(name, weights.base(name, (config.type_vocab_size, config.embedding_size)))
        x = b.op("Add", [x, b.op("Gather", [types, "token_type_ids"], "embeddings.types")], "embeddings.with_types")
    if config.embedding_size != hidden:
        projection = weights.get(f"{weights.prefix}embeddings.embed_proj.weight", (hidden, config.embedding_size))
        x = b.op("MatMul", [x, b.weight("embeddings.embed_proj.weight", projection.T)], "embeddings.projected")
    x = layer_norm(b, x, weights.base_layer_norm("embeddings.LayerNorm", hidden), "embeddings.LayerNorm",
                   config.layer_norm_eps)  # fmt: skip
    x = b.op("Mul", [x, b.op("Unsqueeze", [mask, b.const([2])], "mask.3d")], "embeddings.masked")
    tokens = b.op("Reshape", [x, b.const([-1, hidden])], "embeddings.tokens")
    shared = _shared(b, config, weights, sequence, padding_bias)
    last = config.num_hidden_layers - 1
    for index in range(config.num_hidden_layers):
        tokens = _layer(b, config, weights, index, tokens, shared, rows if index == last else "")
    if rows:
        shape = b.op("Concat", [b.op("Shape", [rows], "shape.rows"), b.const([hidden])], "shape.rows_hidden", axis=0)
        out = b.op("Reshape", [tokens, shape], "last_hidden_state")
        return EncoderOutput(hidden=out, tokens=tokens, mask=mask, padding_bias=padding_bias, word_embeddings=table)
    batch_sequence = b.op("Shape", ["input_ids"], "shape.batch_sequence")
    shape = b.op("Concat", [batch_sequence, b.const([hidden])], "shape.hidden", axis=0)
    out = b.op("Reshape", [tokens, shape], "last_hidden_state")
    return EncoderOutput(hidden=out, tokens=tokens, mask=mask, padding_bias=padding_bias, word_embeddings=table)


@attrs.frozen
class _Shared:
    relative_embeddings: np.ndarray  # [2 * span, hidden], LayerNorm-ed
    window: tuple[str, str]  # int64 [1] each: the first and past-the-last relative position S tokens can reach
    # The relative position each [query, key] pair reads, from the window's start: bucket(query - key) + span,
    # clipped. Both terms read it: content-to-position at its queries' keys, position-to-content at span -
    # bucket(key - query), the same position, since buckets are odd in the distance.
    index: str  # int32 [B, heads, S, S]
    index_2d: str  # int64 [S, S]: before it is expanded (rows are read from it)
    scores_shape: str  # [B, heads, S, S]
    flat_shape: str  # [-1, hidden]: hidden states as rows
    heads_shape: str  # [-1, S, heads, head_size]
    padding_bias: str  # [B, 1, 1, S]


def _shared(
    b: GraphBuilder, config: DebertaConfig, weights: EncoderWeights, sequence: str, padding_bias: str
) -> _Shared:
    span, hidden = config.span, config.hidden_size
    # transformers sizes the table by the buckets, or by the distance limit without them, and reads its first 2·span
    rows = 2 * (config.position_buckets if config.position_buckets > 0 else config.max_relative_positions)
    table = weights.base("encoder.rel_embeddings.weight", (rows, hidden))[: 2 * span]
    scale, shift = weights.base_layer_norm("encoder.LayerNorm", hidden)
    mean = table.mean(axis=-1, keepdims=True)
    variance = ((table - mean) ** 2).mean(axis=-1, keepdims=True)
    normed = ((table - mean) / np.sqrt(variance + config.layer_norm_eps) * scale + shift).astype(np.float32)
    steps = b.op("Range", [b.const(0), b.op("Squeeze", [sequence, b.const([0])], "rel.s"), b.const(1)], "rel.steps")
    rows_1d = b.op("Unsqueeze", [steps, b.const([1])], "rel.rows")
    distance = b.op("Sub", [rows_1d, steps], "rel.distance")  # [S, S]: query - key
    index = b.op("Add", [distance, b.const(MAX_DISTANCE - 1)], "rel.index")
    bucket_table = b.const(relative_buckets(config))
    buckets = b.op("Gather", [bucket_table, index], "rel.buckets")
    low, high = b.const(0), b.const(2 * span - 1)
    # Only the relative positions within the farthest bucket S tokens reach are read: the layers multiply by that
    # window of the 2·span positions, not by all of them (for GLiNER's prompts and texts, a few hundred tokens
    # against 512 positions, most of the attention's arithmetic). Buckets grow with distance and the clip is
    # monotone, so the positions read run from span - bucket(S - 1) to span + bucket(S - 1), each clipped.
    farthest_index = b.op("Add", [sequence, b.const(MAX_DISTANCE - 2)], "rel.farthest_index")  # distance S - 1
    farthest = b.op("Gather", [bucket_table, farthest_index], "rel.farthest")
    start = b.op("Clip", [b.op("Sub", [b.const(span), farthest], "rel.start_raw"), low, high], "rel.start")
    end = b.op("Add", [b.op("Clip", [b.op("Add", [farthest, b.const(span)], "rel.end_raw"), low, high], "rel.last"),
                       b.const(1)], "rel.end")  # fmt: skip
    position = b.op("Clip", [b.op("Add", [buckets, b.const(span)], "rel.position_raw"), low, high], "rel.clipped")
    position = b.op("Sub", [position, start], "rel.position")
    # every layer's scores are [B, heads, S, S]: the index is expanded to that once
    scores_shape = b.op("Concat", [b.op("Shape", ["input_ids"], "shape.batch", start=0, end=1),
                                   b.const([config.num_attention_heads]), sequence, sequence],
                        "shape.scores", axis=0)  # fmt: skip
    heads_shape = b.op("Concat", [b.const([-1]), sequence, b.const([config.num_attention_heads, config.head_size])],
                       "shape.heads", axis=0)  # fmt: skip
    bias = b.op("Unsqueeze", [padding_bias, b.const([1, 2])], "mask.bias_4d")
    expanded = b.op("Expand", [b.op("Cast", [position], "rel.position_32", to=TensorProto.INT32), scores_shape],
                    "rel.position_4d")  # fmt: skip
    return _Shared(normed, (start, end), expanded, position, scores_shape, b.const([-1, hidden]), heads_shape, bias)


def _heads(b: GraphBuilder, x: str, shared: _Shared, name: str) -> str:
    """[B*S, H] -> [B, heads, S, head_size]."""
    return b.op("Transpose", [b.op("Reshape", [x, shared.heads_shape], f"{name}.split")], f"{name}.heads",
                perm=[0, 2, 1, 3])  # fmt: skip


def _layer(  # noqa: PLR0913 - one layer's parts
    b: GraphBuilder,
    config: DebertaConfig,
    weights: EncoderWeights,
    index: int,
    x: str,
    shared: _Shared,
    rows: str = "",
) -> str:
    """One layer over [B*S, H] tokens; with `rows` (int64 [B, P] positions), for those tokens alone (their queries
    against every token's keys and values): [B*P, H] out."""
    family, hidden, heads, d = FAMILY, config.hidden_size, config.num_attention_heads, config.head_size
    name = family.layer.format(index=index)
    scale = np.float32(1.0 / math.sqrt(d * 3))  # content and both position terms

    def params(part: str, width_in: int = hidden, width_out: int = hidden) -> tuple[np.ndarray, np.ndarray]:
        return weights.base_linear(f"{name}.{part}", width_in, width_out)

    q_weight, q_bias = params(family.query)
    k_weight, k_bias = params(family.key)
    residual, index = x, shared.index
    if rows:
        residual = b.op("Reshape", [rows_of(b, x, rows, name), shared.flat_shape], f"{name}.selected")
        query = linear(b, residual, (q_weight * scale, q_bias * scale), f"{name}.q")
        query = row_heads(b, query, rows, heads, d, f"{name}.q")  # [B, heads, P, d]
        # the indices of those queries' rows, [B, heads, P, S]
        rows_scores = b.op("Concat", [b.op("Slice", [shared.scores_shape, b.const([0]), b.const([2])],
                                           f"{name}.batch_heads"), b.op("Shape", [rows], f"{name}.p", start=1),
                                      b.op("Slice", [shared.scores_shape, b.const([3]), b.const([4])], f"{name}.s")],
                           f"{name}.rows_scores_shape", axis=0)  # fmt: skip
        gathered = b.op("Gather", [shared.index_2d, rows], f"{name}.position_rows", axis=0)  # [B, P, S]
        index = b.op("Expand", [b.op("Unsqueeze", [gathered, b.const([1])], f"{name}.position_rows_4d"), rows_scores],
                     f"{name}.position_index")  # fmt: skip
    else:
        query = _heads(b, linear(b, x, (q_weight * scale, q_bias * scale), f"{name}.q"), shared, f"{name}.q")
    key = _heads(b, linear(b, x, (k_weight, k_bias), f"{name}.k"), shared, f"{name}.k")
    value = _heads(b, linear(b, x, params(family.value), f"{name}.v"), shared, f"{name}.v")
    span2 = 2 * config.span
    # the relative embeddings through this layer's key and query projections, constants: the keys [heads, d,
    # 2 * span] (queries multiply them), the queries [heads, 2 * span, d] (they multiply the keys); each sliced to
    # the window of positions the sequence reaches
    position_keys = (shared.relative_embeddings @ k_weight + k_bias).reshape(span2, heads, d).transpose(1, 2, 0)
    position_queries = ((shared.relative_embeddings @ q_weight + q_bias) * scale).reshape(span2, heads, d)
    position_queries = position_queries.transpose(1, 0, 2)
    start, end = shared.window
    position_keys = b.op("Slice", [b.weight(f"{name}.position_keys", position_keys), start, end, b.const([2])],
                         f"{name}.position_keys_window")  # fmt: skip
    position_queries = b.op("Slice", [b.weight(f"{name}.position_queries", position_queries), start, end,
                                      b.const([1])], f"{name}.position_queries_window")  # fmt: skip
    key_t = b.op("Transpose", [key], f"{name}.k_t", perm=[0, 1, 3, 2])
    scores = b.op("MatMul", [query, key_t], f"{name}.c2c")
    # content to position: [B, heads, S, window] read at each [query, key]'s position along the last axis
    c2p = b.op("GatherElements", [b.op("MatMul", [query, position_keys], f"{name}.c2p_all"), index],
               f"{name}.c2p", axis=3)  # fmt: skip
    # position to content: [B, heads, window, S] (positions × keys) read at each [query, key]'s position along the
    # third axis, so the result is over [query, key] without a transpose
    p2c = b.op("GatherElements", [b.op("MatMul", [position_queries, key_t], f"{name}.p2c_all"), index],
               f"{name}.p2c", axis=2)  # fmt: skip
    return _output(b, config, weights, name, _attend(b, name, (scores, c2p, p2c), value, shared), residual)


def _attend(b: GraphBuilder, name: str, terms: tuple[str, str, str], value: str, shared: _Shared) -> str:
    """The score terms (content, content to position, position to content; [B, heads, queries, S]) summed, masked
    and softmaxed, over the values [B, heads, S, d]: [B * queries, hidden]."""
    c2c, c2p, p2c = terms
    scores = b.op("Add", [b.op("Add", [c2c, c2p], f"{name}.with_c2p"), p2c], f"{name}.scores")
    probs = b.op("Softmax", [b.op("Add", [scores, shared.padding_bias], f"{name}.masked")], f"{name}.probs", axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, value], f"{name}.context")], f"{name}.context_t",
                   perm=[0, 2, 1, 3])  # fmt: skip
    return b.op("Reshape", [context, shared.flat_shape], f"{name}.merged")


def _output(b: GraphBuilder, config: DebertaConfig, weights: EncoderWeights, name: str, context: str, x: str) -> str:
    """The attention's output dense, residual and LayerNorm, then the feed-forward block."""
    family, hidden = FAMILY, config.hidden_size

    def params(part: str, width_in: int = hidden, width_out: int = hidden) -> tuple[np.ndarray, np.ndarray]:
        return weights.base_linear(f"{name}.{part}", width_in, width_out)

    attended = linear(b, context, params(family.attention_output), f"{name}.attention_out")
    x = layer_norm(b, b.op("Add", [attended, x], f"{name}.attention_residual"),
                   weights.base_layer_norm(f"{name}.{family.attention_norm}", hidden), f"{name}.attention_norm",
                   config.layer_norm_eps)  # fmt: skip
    inner = gelu(b, linear(b, x, params(family.ffn_in, hidden, config.intermediate_size), f"{name}.ffn_in"),
                 f"{name}.gelu")  # fmt: skip
    out = linear(b, inner, params(family.ffn_out, config.intermediate_size, hidden), f"{name}.ffn_out")
    return layer_norm(b, b.op("Add", [out, x], f"{name}.ffn_residual"),
                      weights.base_layer_norm(f"{name}.{family.ffn_norm}", hidden), f"{name}.ffn_norm",
                      config.layer_norm_eps)  # fmt: skip
