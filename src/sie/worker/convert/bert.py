"""The BERT encoder family, config + weights + graph: `BertConfig` (the fields of a Hugging Face BERT `config.json`
that shape the graph, checked for what the builder cannot handle), `BertWeights` (tensors by their canonical names,
shapes checked) and the encoder as an opset-17 ONNX graph (embeddings, additive attention mask, transformer layers).

The graph stops at the last hidden state; heads live in `heads.py`. Its layout lets onnxruntime's own fusions apply at
load time (MatMul + bias into Gemm, the erf pattern into Gelu). It reads safetensors through `safetensors_io` and
never imports torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder, tensor_info
from sie.worker.convert.safetensors_io import SafetensorsFile

# --- config -----------------------------------------------------------------------------------------------------------

SUPPORTED_MODEL_TYPES = frozenset({"bert"})
# Hugging Face's "gelu" is the exact erf form; the tanh approximations are different functions.
SUPPORTED_ACTIVATIONS = frozenset({"gelu"})
_REQUIRED_INTS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
)


@attrs.frozen
class BertConfig:
    """The architecture numbers of one BERT checkpoint, plus its label names in id order."""

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    labels: tuple[str, ...] = ()

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


def load_bert_config(path: Path) -> BertConfig:
    """Read and validate `config.json`; errors name the file and the field."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConversionError(f"cannot read file: {exc}", source=str(path)) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"not valid JSON: {exc}", source=str(path)) from exc
    if not isinstance(raw, dict):
        raise ConversionError("top level is not a JSON object", source=str(path))
    return parse_bert_config(raw, source=str(path))


def parse_bert_config(raw: dict[str, Any], *, source: str = "config.json") -> BertConfig:
    """Build a `BertConfig` from the decoded JSON object."""
    _check_architecture(raw, source)
    numbers = {key: _positive_int(raw, key, source) for key in _REQUIRED_INTS}
    if numbers["hidden_size"] % numbers["num_attention_heads"]:
        raise ConversionError(
            f"hidden_size {numbers['hidden_size']} is not a multiple of "
            f"num_attention_heads {numbers['num_attention_heads']}",
            source=source,
        )
    eps = raw.get("layer_norm_eps", 1e-12)
    if not isinstance(eps, int | float) or isinstance(eps, bool) or eps <= 0:
        raise ConversionError(f"layer_norm_eps {eps!r} is not a positive number", source=source)
    type_vocab = _positive_int(raw, "type_vocab_size", source) if "type_vocab_size" in raw else 2
    return BertConfig(
        **numbers,
        type_vocab_size=type_vocab,
        layer_norm_eps=float(eps),
        hidden_act=raw.get("hidden_act", "gelu"),
        labels=_labels(raw.get("id2label"), source),
    )


def _check_architecture(raw: dict[str, Any], source: str) -> None:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(f"model_type {model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}", source=source)
    act = raw.get("hidden_act", "gelu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ConversionError(f"hidden_act {act!r} is not supported (only erf 'gelu')", source=source)
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ConversionError(f"position_embedding_type {position_type!r} is not 'absolute'", source=source)


def _positive_int(raw: dict[str, Any], key: str, source: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConversionError(f"{key} {value!r} is missing or not a positive integer", source=source)
    return value


def _labels(id2label: Any, source: str) -> tuple[str, ...]:
    if id2label is None:
        return ()
    if not isinstance(id2label, dict):
        raise ConversionError(f"id2label {id2label!r} is not an object", source=source)
    try:
        by_id = {int(key): str(value) for key, value in id2label.items()}
    except ValueError as exc:
        raise ConversionError(f"id2label has a non-integer key: {exc}", source=source) from exc
    if sorted(by_id) != list(range(len(by_id))):
        raise ConversionError(f"id2label ids {sorted(by_id)} are not 0..{len(by_id) - 1}", source=source)
    return tuple(by_id[index] for index in range(len(by_id)))


# --- weights ----------------------------------------------------------------------------------------------------------

_OLD_LAYER_NORM_NAMES = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


class BertWeights:
    """Tensor lookup over one safetensors file, with BERT's naming variants resolved: the `bert.` prefix of task
    models and the old `gamma`/`beta` LayerNorm names, so the graph builder asks for one name per parameter."""

    def __init__(self, tensors: SafetensorsFile) -> None:
        self.tensors = tensors
        names = tensors.entries
        self.prefix = "bert." if any(name.startswith("bert.embeddings.") for name in names) else ""

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

    def linear(self, name: str, in_features: int, out_features: int) -> tuple[np.ndarray, np.ndarray]:
        """`(weight [in, out], bias [out])` of the torch Linear `name`, transposed for `x @ W`."""
        weight = self.get(f"{name}.weight", (out_features, in_features))
        bias = self.get(f"{name}.bias", (out_features,))
        return np.ascontiguousarray(weight.T), bias

    def layer_norm(self, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
        """`(scale, bias)` of the LayerNorm `name`."""
        return self.get(f"{name}.weight", (width,)), self.get(f"{name}.bias", (width,))

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
