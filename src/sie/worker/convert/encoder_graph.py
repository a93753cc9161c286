"""The encoder graph of the BERT-like families (`families.py`): `EncoderWeights` (a checkpoint's tensors by their
canonical names, shapes checked) and the encoder as an opset-17 ONNX graph (embeddings, attention mask,
post-LayerNorm transformer layers).

The graph stops at the last hidden state; heads live in `heads.py`. Each layer's self-attention is onnxruntime's
fused `Attention` (one Q/K/V projection, the padding mask and any position bias: MPNet's buckets, JinaBERT's ALiBi;
a contrib operator on CPU and CUDA, faster on CPU at MiniLM size than the same math in plain operators), and each
residual + LayerNorm an Add and a `LayerNormalization` (onnxruntime 1.31's fused `SkipLayerNormalization` runs
2-3× slower on CPU than the pair: 5.4 against 2.4 ms on 4096 × 384, a BERT 5-7 % slower in all); the rest lets
onnxruntime's own fusions apply at load time (MatMul + bias into Gemm, the erf pattern into Gelu). It reads
safetensors through `safetensors_io` and never imports torch.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import MPNET_BUCKETS, EncoderConfig
from sie.worker.convert.graph_builder import CONTRIB_DOMAIN, GraphBuilder, tensor_info
from sie.worker.convert.jina_flash import FlashXlmRobertaTensors
from sie.worker.convert.safetensors_io import Checkpoint, CheckpointPart

# --- weights ----------------------------------------------------------------------------------------------------------

_OLD_LAYER_NORM_NAMES = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


class EncoderWeights:
    """Tensor lookup over a checkpoint, with the naming variants resolved: the base-model prefix of task models
    (`bert.`, `roberta.`, ...) and the old `gamma`/`beta` LayerNorm names, so the graph builder asks for one name per
    parameter."""

    def __init__(self, tensors: Checkpoint | CheckpointPart | FlashXlmRobertaTensors, config: EncoderConfig) -> None:
        self.tensors = tensors
        prefix = config.family.prefix
        self.prefix = prefix if any(name.startswith(f"{prefix}embeddings.") for name in tensors.entries) else ""

    @property
    def source(self) -> str:
        return str(self.tensors.path)

    def base(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A tensor of the encoder itself (`embeddings.*`, `encoder.*`, `pooler.*`)."""
        return self.get(self.prefix + name, shape)

    def base_linear(self, name: str, in_features: int, out_features: int) -> tuple[np.ndarray, np.ndarray]:
        return self.linear(self.prefix + name, in_features, out_features)

    def base_layer_norm(self, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
        return self.layer_norm(self.prefix + name, width)

    def has(self, name: str) -> bool:
        return self._stored_name(name) is not None

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of the tensor `name` (one whose size the config does not say)."""
        stored = self._stored_name(name)
        if stored is None:
            raise ConversionError("required tensor is missing", source=self.source, tensor=name)
        return tuple(self.tensors.entries[stored].shape)

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor `name` (a full name such as `classifier.weight`) as float32 of exactly `shape`."""
        stored = self._stored_name(name)
        if stored is None:
            raise ConversionError("required tensor is missing", source=self.source, tensor=name)
        array = self.tensors.load(stored)
        if array.shape != shape:
            raise ConversionError(
                f"has shape {list(array.shape)}, expected {list(shape)}", source=self.source, tensor=stored
            )
        if not np.isfinite(array).all():
            raise ConversionError("contains NaN or infinite values", source=self.source, tensor=stored)
        return array

    def linear(
        self, name: str, in_features: int, out_features: int, bias: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(weight [in, out], bias [out])` of the torch Linear `name`, transposed for `x @ W`; a Linear built
        without a bias (`bias=False`, as its config says) gets zeros, so it is one Gemm all the same."""
        weight = self.get(f"{name}.weight", (out_features, in_features))
        values = self.get(f"{name}.bias", (out_features,)) if bias else np.zeros(out_features, dtype=np.float32)
        return np.ascontiguousarray(weight.T), values

    def layer_norm(self, name: str, width: int, bias: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """`(scale, bias)` of the LayerNorm `name` (zeros for a LayerNorm built without a bias)."""
        values = self.get(f"{name}.bias", (width,)) if bias else np.zeros(width, dtype=np.float32)
        return self.get(f"{name}.weight", (width,)), values

    def _stored_name(self, name: str) -> str | None:
        if name in self.tensors:
            return name
        for new, old in _OLD_LAYER_NORM_NAMES.items():
            if name.endswith(new):
                legacy = name[: -len(new)] + old
                if legacy in self.tensors:
                    return legacy
        return None


# --- graph ------------------------------------------------------------------------------------------------------------

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
class LayerShapes:
    """Runtime shapes and masks computed once from the inputs and shared by every layer."""

    sequence: str  # [S]
    batch_sequence: str  # [B, S]
    tokens_3d: str  # [B, S, H]: the fused attention reads [B, S, H]
    mask_int32: str  # the attention mask as the fused attention reads it


def graph_inputs() -> list[onnx.ValueInfoProto]:
    return [tensor_info(name, TensorProto.INT64, [BATCH, SEQUENCE]) for name in INPUT_NAMES]


def build_encoder(
    builder: GraphBuilder,
    config: EncoderConfig,
    weights: EncoderWeights,
    hidden_name: str = "last_hidden_state",
    *,
    rows: str = "",
) -> EncoderOutput:
    """Add embeddings and every layer; the final [B,S,H] hidden state is named `hidden_name`.

    Between embeddings and output the hidden state is a [B*S, H] matrix, so onnxruntime turns
    every MatMul + bias Add into one Gemm.

    `rows` (an int64 [B, P] tensor of positions, for a head that reads those tokens' states alone: a cross-encoder's
    classifier its first token, GLiClass its first token and label markers): the last layer is computed at those
    positions only, their queries against every token's keys and values, and the hidden state is [B, P, H] (`tokens`
    [B*P, H]). The same values at those positions; the last layer's attention output and feed-forward products shrink
    from every token to P rows per sequence.
    """
    shapes = layer_shapes(builder, config)
    word_table, embedded = _embeddings(builder, config, weights, shapes.sequence)
    mask, padding_bias = padding_biases(builder)
    position_bias = ""  # [1, heads, S, S], added to every layer's scores
    if config.relative_attention_buckets:
        position_bias = _relative_position_bias(builder, config, weights, shapes.sequence)
    elif config.alibi:
        position_bias = _alibi_bias(builder, config, shapes.sequence)
    tokens = builder.op("Reshape", [embedded, builder.const([-1, config.hidden_size])], "embeddings.tokens")
    last = config.num_hidden_layers - 1
    for index in range(config.num_hidden_layers):
        layer = EncoderLayer(builder, config, weights, index, shapes)
        if rows and index == last:
            tokens = layer.feed_forward(layer.rows_attention(tokens, rows, position_bias, padding_bias))
            rows_shape = builder.op("Shape", [rows], "shape.rows")
            shape = builder.op("Concat", [rows_shape, builder.const([config.hidden_size])], "shape.rows_hidden", axis=0)
            hidden = builder.op("Reshape", [tokens, shape], hidden_name)
            return EncoderOutput(hidden=hidden, tokens=tokens, mask=mask, padding_bias=padding_bias,
                                 word_embeddings=word_table)  # fmt: skip
        tokens = layer.feed_forward(layer.attention(tokens, position_bias))
    hidden_shape = builder.op(
        "Concat", [shapes.batch_sequence, builder.const([config.hidden_size])], "shape.hidden", axis=0
    )
    hidden = builder.op("Reshape", [tokens, hidden_shape], hidden_name)
    return EncoderOutput(hidden=hidden, tokens=tokens, mask=mask, padding_bias=padding_bias, word_embeddings=word_table)


def first_rows(builder: GraphBuilder) -> str:
    """The int64 [B, 1] positions of each sequence's first token: `rows` for a head that reads it alone."""
    batch_one = builder.op("Concat", [builder.op("Shape", ["input_ids"], "shape.batch_only", start=0, end=1),
                                      builder.const([1])], "shape.batch_one", axis=0)  # fmt: skip
    return builder.op("Expand", [builder.const([[0]]), batch_one], "rows.first")


def rows_of(builder: GraphBuilder, x: str, rows: str, name: str) -> str:
    """The [B*S, H] tokens `x` at the int64 [B, P] `rows`: [B, P, H]."""
    width = builder.op("Shape", [x], f"{name}.width", start=1, end=2)
    index = builder.op("Expand", [builder.op("Unsqueeze", [rows, builder.const([2])], f"{name}.rows_3d"),
                                  builder.op("Concat", [builder.op("Shape", [rows], f"{name}.rows_shape"), width],
                                             f"{name}.index_shape", axis=0)], f"{name}.index")  # fmt: skip
    batch_sequence_width = builder.op("Concat", [builder.op("Shape", ["input_ids"], f"{name}.batch_sequence"), width],
                                      f"{name}.tokens_3d", axis=0)  # fmt: skip
    tokens = builder.op("Reshape", [x, batch_sequence_width], f"{name}.tokens")
    return builder.op("GatherElements", [tokens, index], f"{name}.rows", axis=1)


def row_heads(builder: GraphBuilder, x: str, rows: str, heads: int, head_size: int, name: str) -> str:
    """The [B*P, heads * head_size] projections of the tokens at the int64 [B, P] `rows`, split into heads:
    [B, heads, P, head_size]."""
    shape = builder.op("Concat", [builder.op("Shape", [rows], f"{name}.rows_shape"), builder.const([heads, head_size])],
                       f"{name}.heads_shape", axis=0)  # fmt: skip
    return builder.op("Transpose", [builder.op("Reshape", [x, shape], f"{name}.split")], f"{name}.heads",
                      perm=[0, 2, 1, 3])  # fmt: skip


def layer_shapes(builder: GraphBuilder, config: EncoderConfig) -> LayerShapes:
    sequence = builder.op("Shape", ["input_ids"], "shape.sequence", start=1, end=2)
    batch_sequence = builder.op("Shape", ["input_ids"], "shape.batch_sequence")
    tokens_3d = builder.op("Concat", [batch_sequence, builder.const([config.hidden_size])], "shape.tokens_3d", axis=0)
    mask_int32 = builder.op("Cast", ["attention_mask"], "mask.int32", to=TensorProto.INT32)
    return LayerShapes(sequence=sequence, batch_sequence=batch_sequence, tokens_3d=tokens_3d, mask_int32=mask_int32)


def layer_norm(builder: GraphBuilder, x: str, params: tuple[np.ndarray, np.ndarray], name: str, eps: float) -> str:
    """LayerNormalization over the last axis; parameters are stored as `{name}.weight`/`.bias`."""
    scale = builder.weight(f"{name}.weight", params[0])
    bias = builder.weight(f"{name}.bias", params[1])
    return builder.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=eps)


def residual_layer_norm(
    builder: GraphBuilder, x: str, residual: str, params: tuple[np.ndarray, np.ndarray], name: str, eps: float
) -> str:
    """LayerNorm(x + residual); parameters as `layer_norm`'s (an Add and a LayerNormalization: see the module
    docstring for why not the fused contrib operator)."""
    return layer_norm(builder, builder.op("Add", [x, residual], f"{name}.residual"), params, name, eps)


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


def _embeddings(
    builder: GraphBuilder, config: EncoderConfig, weights: EncoderWeights, sequence: str
) -> tuple[str, str]:
    """Word + position (+ token type) embeddings, LayerNorm, and ELECTRA's projection to the hidden size. Returns the
    word table (a tied MLM decoder reuses it) and the embedded tokens [B, S, H]."""
    width = config.embedding_width
    word_table = builder.weight(
        "embeddings.word_embeddings.weight",
        weights.base("embeddings.word_embeddings.weight", (config.vocab_size, width)),
    )
    summed = builder.op("Gather", [word_table, "input_ids"], "embeddings.words")
    summed = add_token_types(builder, summed, weights, config.type_vocab_size, width)
    if not config.alibi:  # ALiBi places tokens by biasing attention, not by embeddings
        position_table = builder.weight(
            "embeddings.position_embeddings.weight",
            weights.base("embeddings.position_embeddings.weight", (config.max_position_embeddings, width)),
        )
        summed = builder.op("Add", [summed, _positions(builder, config, position_table, sequence)], "embeddings.sum")
    params = weights.base_layer_norm("embeddings.LayerNorm", width)
    embedded = layer_norm(builder, summed, params, "embeddings.LayerNorm", config.layer_norm_eps)
    if config.embedding_size:
        project = weights.base_linear("embeddings_project", width, config.hidden_size)
        embedded = linear(builder, embedded, project, "embeddings_project")
    return word_table, embedded


def add_token_types(builder: GraphBuilder, embedded: str, weights: EncoderWeights, types: int, width: int) -> str:
    """`embedded` plus each token's type embedding (`embeddings.token_type_embeddings`); as it is for no types."""
    if not types:
        return embedded
    rows = weights.base("embeddings.token_type_embeddings.weight", (types, width))
    if types == 1:  # one token type: every token adds the same row, whatever its id says
        added = builder.weight("embeddings.token_type_embeddings.weight", rows[0])
    else:
        table = builder.weight("embeddings.token_type_embeddings.weight", rows)
        added = builder.op("Gather", [table, "token_type_ids"], "embeddings.types")
    return builder.op("Add", [embedded, added], "embeddings.word_type")


def _positions(builder: GraphBuilder, config: EncoderConfig, table: str, sequence: str) -> str:
    """The position embedding of every token: rows 0..S-1, or RoBERTa's (`padding_idx` for padding ids, then
    padding_idx + 1, + 2, ... over the others, counted along the row)."""
    if config.padding_idx is None:
        # Positions are 0..S-1, so the first S rows of the table replace a Range + Gather.
        return builder.op("Slice", [table, builder.const([0]), sequence, builder.const([0])], "embeddings.positions")
    pad = builder.const(config.padding_idx)
    is_pad = builder.op("Equal", ["input_ids", pad], "embeddings.is_pad")
    real = builder.op(
        "Cast", [builder.op("Not", [is_pad], "embeddings.is_real")], "embeddings.real", to=TensorProto.INT64
    )
    counted = builder.op("CumSum", [real, builder.const(1)], "embeddings.counted")
    counted = builder.op("Mul", [counted, real], "embeddings.counted_real")
    position_ids = builder.op("Add", [counted, pad], "embeddings.position_ids")
    return builder.op("Gather", [table, position_ids], "embeddings.positions")


def relative_position_buckets(relative: np.ndarray, num_buckets: int, max_distance: int = 128) -> np.ndarray:
    """MPNet's (T5's) bucket of each key-minus-query distance: exact below a quarter of the buckets, then
    logarithmic up to `max_distance`, with the sign in the upper half. Float32 arithmetic, as the modeling code."""
    n = -relative.astype(np.int64)
    half = num_buckets // 2
    buckets = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    max_exact = half // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.log(n.astype(np.float32) / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
        large = max_exact + (scaled * np.float32(half - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return buckets + np.where(n < max_exact, n, large)


def _relative_position_bias(
    builder: GraphBuilder, config: EncoderConfig, weights: EncoderWeights, sequence: str
) -> str:
    """MPNet's learned bias of each head for each (query, key) pair, [1, heads, S, S]: the bucket of every distance
    the positions allow is a constant, gathered by `key - query` and then through the learned table."""
    positions = config.max_position_embeddings
    offsets = np.arange(-(positions - 1), positions)  # key - query, shifted by positions - 1 to index from 0
    buckets = builder.const(relative_position_buckets(offsets, MPNET_BUCKETS))
    table = builder.weight(
        "encoder.relative_attention_bias.weight",
        weights.base(
            config.family.relative_attention_bias, (config.relative_attention_buckets, config.num_attention_heads)
        ),
    )
    length = builder.op("Squeeze", [sequence, builder.const([0])], "position_bias.length")
    steps = builder.op("Range", [builder.const(0), length, builder.const(1)], "position_bias.steps")
    keys = builder.op("Unsqueeze", [steps, builder.const([0])], "position_bias.keys")
    queries = builder.op("Unsqueeze", [steps, builder.const([1])], "position_bias.queries")
    distance = builder.op("Sub", [keys, queries], "position_bias.distance")
    index = builder.op("Add", [distance, builder.const(positions - 1)], "position_bias.index")
    bucket = builder.op("Gather", [buckets, index], "position_bias.bucket")
    values = builder.op("Gather", [table, bucket], "position_bias.values")  # [S, S, heads]
    values = builder.op("Transpose", [values], "position_bias.per_head", perm=[2, 0, 1])
    return builder.op("Unsqueeze", [values, builder.const([0])], "position_bias")


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's slope of each head: the geometric series 2^(-8/n), 2^(-16/n), ... for n heads when n is a power of
    two; otherwise those of the power of two below, then every other slope of the power of two above."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (index + 1) for index in range(n)]

    if math.log2(heads).is_integer():
        return np.asarray(power_of_two(heads), dtype=np.float32)
    below = 2 ** math.floor(math.log2(heads))
    extra = alibi_slopes(2 * below)[0::2][: heads - below]
    return np.concatenate([np.asarray(power_of_two(below), dtype=np.float32), extra])


def _alibi_bias(builder: GraphBuilder, config: EncoderConfig, sequence: str) -> str:
    """JinaBERT's ALiBi, [1, heads, S, S]: `-slope[head] * |query - key|`, symmetric (every token sees both ways)."""
    length = builder.op("Squeeze", [sequence, builder.const([0])], "alibi.length")
    steps = builder.op("Range", [builder.const(0), length, builder.const(1)], "alibi.steps")
    keys = builder.op("Unsqueeze", [steps, builder.const([0])], "alibi.keys")
    queries = builder.op("Unsqueeze", [steps, builder.const([1])], "alibi.queries")
    distance = builder.op("Abs", [builder.op("Sub", [keys, queries], "alibi.offset")], "alibi.distance")
    distance = builder.op("Cast", [distance], "alibi.distance_float", to=TensorProto.FLOAT)
    slopes = builder.const(-alibi_slopes(config.num_attention_heads).reshape(1, -1, 1, 1), np.float32)
    return builder.op("Mul", [slopes, distance], "alibi")


def padding_biases(builder: GraphBuilder) -> tuple[str, str]:
    """The float mask [B,S] and the additive bias (1 - mask) * MASK_NEGATIVE, also [B,S]."""
    mask = builder.op("Cast", ["attention_mask"], "mask.float", to=TensorProto.FLOAT)
    inverted = builder.op("Sub", [builder.const(1.0, np.float32), mask], "mask.inverted")
    return mask, builder.op("Mul", [inverted, builder.const(MASK_NEGATIVE, np.float32)], "mask.padding_bias")


class EncoderLayer:
    """One transformer layer's sub-graphs; weights are read as each block is built."""

    def __init__(
        self, builder: GraphBuilder, config: EncoderConfig, weights: EncoderWeights, index: int, shapes: LayerShapes
    ) -> None:
        self.builder = builder
        self.config = config
        self.weights = weights
        self.shapes = shapes
        self.family = config.family
        self.prefix = config.family.layer.format(index=index)

    def attention(self, x: str, position_bias: str, *, causal: bool = False) -> str:
        """Self-attention on [B*S, H] tokens (onnxruntime's fused `Attention`: Q/K/V projection, 1/sqrt(head_size),
        the padding mask, `position_bias` when there is one, softmax), then output dense, residual and LayerNorm.
        `causal`: each token attends to itself and the tokens before it, with no padding mask (BART's decoder)."""
        b, cfg, name = self.builder, self.config, f"{self.prefix}.attention"
        weight, bias = self._qkv_params()
        tokens = b.op("Reshape", [x, self.shapes.tokens_3d], f"{name}.tokens_3d")
        inputs = [tokens, b.weight(f"{name}.qkv.weight", weight), b.weight(f"{name}.qkv.bias", bias)]
        if not causal:
            inputs += [self.shapes.mask_int32, "", position_bias] if position_bias else [self.shapes.mask_int32]
        context = b.op("Attention", inputs, f"{name}.fused", domain=CONTRIB_DOMAIN, num_heads=cfg.num_attention_heads,
                       **({"unidirectional": 1} if causal else {}))  # fmt: skip
        context = b.op("Reshape", [context, b.const([-1, cfg.hidden_size])], f"{name}.merged")
        output = self._name(self.family.attention_output)
        out = linear(b, context, self._dense(output, cfg.hidden_size), output)
        return self._residual_norm(out, x, self._name(self.family.attention_norm))

    def rows_attention(self, x: str, rows: str, position_bias: str, padding_bias: str) -> str:
        """`attention` at the int64 [B, P] positions `rows` alone: their queries against every token's keys and values
        (the padding masked, `position_bias`'s rows of those queries added), then output dense, residual and
        LayerNorm; [B*S, H] in, [B*P, H] out. The same math as the fused operator, in plain operators."""
        b, cfg, name = self.builder, self.config, f"{self.prefix}.attention"
        width, heads = cfg.hidden_size, cfg.num_attention_heads
        head_size = width // heads
        weight, bias = self._qkv_params()
        scale = np.float32(1.0 / math.sqrt(head_size))
        selected = b.op("Reshape", [rows_of(b, x, rows, name), b.const([-1, width])], f"{name}.selected")
        query = linear(b, selected, (weight[:, :width] * scale, bias[:width] * scale), f"{name}.rows_query")
        query = row_heads(b, query, rows, heads, head_size, f"{name}.rows_query")  # [B, heads, P, d]
        keys_values = linear(b, x, (weight[:, width:], bias[width:]), f"{name}.keys_values")
        split = b.op("Concat", [self.shapes.batch_sequence, b.const([2, heads, head_size])], f"{name}.kv_shape",
                     axis=0)  # fmt: skip
        keys, values = b.op_multi("Split", [b.op("Reshape", [keys_values, split], f"{name}.kv_heads"),
                                            b.const([1, 1])], [f"{name}.k", f"{name}.v"], axis=2)  # fmt: skip
        keys = b.op("Squeeze", [keys, b.const([2])], f"{name}.k_rows")  # [B, S, heads, d]
        keys = b.op("Transpose", [keys], f"{name}.keys", perm=[0, 2, 3, 1])  # [B, heads, d, S]
        values = b.op("Squeeze", [values, b.const([2])], f"{name}.v_rows")
        values = b.op("Transpose", [values], f"{name}.values", perm=[0, 2, 1, 3])  # [B, heads, S, d]
        scores = b.op("MatMul", [query, keys], f"{name}.rows_scores")  # [B, heads, P, S]
        scores = b.op("Add", [scores, b.op("Unsqueeze", [padding_bias, b.const([1, 2])], f"{name}.padding_4d")],
                      f"{name}.rows_masked")  # fmt: skip
        if position_bias:  # [1, heads, S, S]: each query's row, [heads, B, P, S], then [B, heads, P, S]
            by_query = b.op("Gather", [b.op("Squeeze", [position_bias, b.const([0])], f"{name}.bias_3d"), rows],
                            f"{name}.rows_bias", axis=1)  # fmt: skip
            by_query = b.op("Transpose", [by_query], f"{name}.rows_bias_t", perm=[1, 0, 2, 3])
            scores = b.op("Add", [scores, by_query], f"{name}.rows_biased")
        probs = b.op("Softmax", [scores], f"{name}.rows_probs", axis=-1)
        context = b.op("MatMul", [probs, values], f"{name}.rows_context")  # [B, heads, P, d]
        context = b.op("Transpose", [context], f"{name}.rows_context_t", perm=[0, 2, 1, 3])
        context = b.op("Reshape", [context, b.const([-1, width])], f"{name}.rows_merged")
        output = self._name(self.family.attention_output)
        out = linear(b, context, self._dense(output, width), output)
        return self._residual_norm(out, selected, self._name(self.family.attention_norm))

    def feed_forward(self, x: str) -> str:
        b, cfg = self.builder, self.config
        ffn_in, ffn_out = self._name(self.family.ffn_in), self._name(self.family.ffn_out)
        if cfg.gated_activation:
            activated = self._gated(x, ffn_in)
        else:
            inner = linear(b, x, self._dense(ffn_in, cfg.intermediate_size), ffn_in)
            activated = gelu(b, inner, f"{self.prefix}.ffn.gelu")
        out = linear(b, activated, self.weights.base_linear(ffn_out, cfg.intermediate_size, cfg.hidden_size), ffn_out)
        return self._residual_norm(out, x, self._name(self.family.ffn_norm))

    def _gated(self, x: str, name: str) -> str:
        """JinaBERT's gated feed-forward input: one bias-free [H, 2I] product, the activation of its first half
        times its second half."""
        b, cfg = self.builder, self.config
        weight = self.weights.base(f"{name}.weight", (2 * cfg.intermediate_size, cfg.hidden_size))
        both = b.op("MatMul", [x, b.weight(f"{name}.weight", np.ascontiguousarray(weight.T))], f"{name}.matmul")
        halves = b.const([cfg.intermediate_size] * 2)
        gated, plain = b.op_multi("Split", [both, halves], [f"{name}.gated", f"{name}.plain"], axis=-1)
        if cfg.gated_activation == "relu":
            activated = b.op("Relu", [gated], f"{name}.relu")
        else:
            activated = gelu(b, gated, f"{name}.gelu")
        return b.op("Mul", [activated, plain], f"{name}.product")

    def _name(self, part: str) -> str:
        return f"{self.prefix}.{part}"

    def _qkv_params(self) -> tuple[np.ndarray, np.ndarray]:
        """Q, K and V side by side as one [H, 3H] matrix (the fused attention scales by 1/sqrt(head_size))."""
        width = self.config.hidden_size
        (wq, bq), (wk, bk), (wv, bv) = (
            self.weights.base_linear(self._name(part), width, width)
            for part in (self.family.query, self.family.key, self.family.value)
        )
        return np.concatenate([wq, wk, wv], axis=1), np.concatenate([bq, bk, bv])

    def _dense(self, name: str, out_features: int) -> tuple[np.ndarray, np.ndarray]:
        return self.weights.base_linear(name, self.config.hidden_size, out_features)

    def _residual_norm(self, out: str, residual: str, name: str) -> str:
        params = self.weights.base_layer_norm(name, self.config.hidden_size)
        return residual_layer_norm(self.builder, out, residual, params, name, self.config.layer_norm_eps)
