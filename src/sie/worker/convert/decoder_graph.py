"""The decoder graph every decoder family converts to (Llama, Mistral, Qwen2, Qwen3; GGUF llama files too): its
architecture numbers (`DecoderConfig`), its tensors by role (`DecoderWeights`, in transformers' names and `[out, in]`
layout, whatever file they come from) and the opset-17 ONNX graph, in one of two shapes (`DecoderShape`):

- `generate`: inputs `input_ids [batch, sequence]`, `attention_mask [batch, past + sequence]` (1 = real token, left
  padding allowed), `position_ids [batch, sequence]`, `past_key_values.{i}.key|value [batch, kv_heads, past,
  head_dim]`; outputs `logits [batch, 1, vocab]` (float32) of the last position only (all a decoder samples from:
  a prefill pays the output head once per prompt) and `present.{i}.key|value [batch, kv_heads, past + sequence,
  head_dim]`; a linear-attention layer (Qwen3.5's, `gated_delta`) carries its two fixed-size states instead,
  `past_key_values.{i}.conv|recurrent` in and `present.{i}.conv|recurrent` out; a layer that attends over an earlier
  layer's keys and values (Gemma 4's last layers) carries none, and as nothing after it is cached, the layers from
  the first of them on run the last position only.
- `hidden`: inputs `input_ids`, `attention_mask [batch, sequence]` (right padding: a causal decoder's real tokens
  never see the padding after them, so they keep positions 0…n−1 and the states they have unpadded); output
  `last_hidden_state [batch, sequence, hidden]` after the final norm, which the embedding and reranker adapters pool.

Each layer: RMSNorm, grouped-query attention with rotary positions (rotate-half; the inverse frequencies of the
config's RoPE type, `rope_frequencies`), optional q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3), a sliding
window per layer (Mistral, Qwen2's `layer_types`), RoPE on part of each head and a sigmoid gate on the attention's
output (Qwen3.5), or a gated delta-rule layer in its place (Qwen3.5's linear attention), then RMSNorm and a SwiGLU
MLP. Gemma 4 adds per-layer head sizes, unscaled value norms, keys as values, shared caches, per-layer inputs and
layer scalars (`DecoderConfig`). In a float16 graph the weights,
matrix products and cache are float16 while the residual stream, norms, softmax and logits stay float32. Standard
ONNX operators only; onnxruntime fuses the RMSNorm and the transposed-key product at load time.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gated_delta import GatedDelta, gated_delta_layer, row_mask, state_inputs
from sie.worker.convert.graph_builder import GraphBuilder, tensor_info
from sie.worker.convert.names import (
    ATTENTION_MASK,
    INPUT_IDS,
    KV_CACHE_LAYERS,
    LOGITS,
    POSITION_IDS,
    past_key_name,
    past_value_name,
    present_key_name,
    present_value_name,
)

HIDDEN_STATE: Final = "last_hidden_state"
ROPE_TYPES: Final = frozenset({"default", "linear", "llama3", "yarn", "proportional"})
ACTIVATIONS: Final = frozenset({"silu", "gelu_tanh"})


class DecoderShape(enum.Enum):
    """What a converted decoder graph takes and gives (module docstring)."""

    GENERATE = "generate"
    HIDDEN = "hidden"


@attrs.frozen
class DecoderConfig:
    """One decoder's shape and options, in transformers' config names."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10_000.0
    rope_scaling: Mapping[str, Any] = attrs.field(factory=dict)  # rope_type and its parameters; {} = default
    # llama.cpp's divisor of each pair's inverse frequency (a GGUF's `rope_freqs` tensor: how its converter stores
    # Llama 3.1's scaling), applied to the global table; () = none
    rope_frequency_factors: tuple[float, ...] = ()
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2; Llama's attention_bias)
    output_bias: bool = False  # a bias on the attention's output projection (Llama's attention_bias)
    mlp_bias: bool = False  # biases on the gate, up and down projections (Llama's mlp_bias)
    qk_norm: bool = False  # RMSNorm over each query and key head before the rotation (Qwen3, Gemma 3)
    qk_norm_after_rotation: bool = False  # with qk_norm: the norm follows the rotation instead (HunYuan)
    layer_windows: tuple[int | None, ...] = ()  # per layer: the sliding window in tokens, None for full attention
    # Gemma 3's differences: norms scale by (1 + weight), embeddings are multiplied by sqrt(hidden), queries scaled by
    # query_pre_attn_scalar ** -0.5, a norm after attention and around the MLP ("sandwich"), a tanh-GELU gate, the
    # windowed layers' own RoPE base, a soft cap on the logits; embeddinggemma attends both ways.
    norm_offset: float = 0.0
    embedding_multiplier: float = 1.0
    attention_scale: float | None = None  # None: head_dim ** -0.5
    sandwich_norms: bool = False
    activation: str = "silu"  # or "gelu_tanh"
    local_rope_theta: float | None = None  # the windowed layers' RoPE base (default type), where it differs
    final_logit_softcap: float | None = None
    causal: bool = True
    # Granite's: each block's output scaled before its residual add, the logits divided (embedding_multiplier and
    # attention_scale above are its embedding and attention multipliers)
    residual_multiplier: float = 1.0
    logits_divisor: float = 1.0
    # Qwen3.5's: RoPE on the first `rotary_dim` dimensions of each head only (0: all of them), a gate from q_proj
    # (each head's query followed by its gate) that scales the attention's output by sigmoid(gate) before o_proj, and
    # gated delta-rule layers in place of attention on `linear_attention.layers` (`gated_delta`)
    rotary_dim: int = 0
    attention_output_gate: bool = False
    linear_attention: GatedDelta | None = None
    # Gemma 4's: per layer, the head size and key/value heads where layers differ (its full-attention layers' wider
    # heads; () = head_dim and num_key_value_heads everywhere), the MLP width (its double-wide MLPs), and the layer
    # whose keys and values it attends over (its shared-cache layers read an earlier layer's; () = its own); values
    # RMS-normalised without a scale; keys as the values on the full-attention layers (no v_proj); a per-layer input
    # of `per_layer_input_size` values per token from its own embedding table and the residual stream, gated into
    # each layer's output; each layer's output scaled by its stored `layer_scalar`
    layer_head_dims: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    layer_intermediate_sizes: tuple[int, ...] = ()
    kv_sources: tuple[int, ...] = ()
    value_norm: bool = False
    keys_as_values: bool = False
    per_layer_input_size: int = 0
    per_layer_vocab_size: int = 0
    layer_scalars: bool = False

    @property
    def query_groups(self) -> int:
        """Query heads that share one key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def query_scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    @property
    def rotary_width(self) -> int:
        """The head dimensions RoPE rotates (of a layer with `head_dim`-wide heads)."""
        return self.rotary_dim or self.head_dim

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_key_value_heads

    def intermediate_size_of(self, layer: int) -> int:
        return self.layer_intermediate_sizes[layer] if self.layer_intermediate_sizes else self.intermediate_size

    def kv_source(self, layer: int) -> int:
        """The layer whose keys and values `layer` attends over: itself, or (Gemma 4) the earlier one it shares."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def caches(self, layer: int) -> bool:
        """Whether `layer` keeps a key/value cache: an attention layer with keys and values of its own."""
        return self.attends(layer) and self.kv_source(layer) == layer

    def values_from_keys(self, layer: int) -> bool:
        """Whether `layer`'s values are its keys before their norm and rotation (Gemma 4's full-attention layers)."""
        return self.keys_as_values and self.window(layer) is None

    def cache_layers(self) -> dict[int, tuple[int, int]]:
        """Each caching layer's key/value heads and head size."""
        layers = range(self.num_hidden_layers)
        return {layer: (self.kv_heads_of(layer), self.head_dim_of(layer)) for layer in layers if self.caches(layer)}

    def attends(self, layer: int) -> bool:
        """Whether `layer` is an attention layer (with a key/value cache), not a linear-attention one."""
        return self.linear_attention is None or layer not in self.linear_attention.layers

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def rope_of(self, layer: int) -> str:
        """Which rotary table a layer reads: `local` (the windowed layers' own base) or `global`."""
        return "local" if self.local_rope_theta is not None and self.window(layer) is not None else "global"

    def check(self, source: str) -> None:
        """ConversionError for shapes the graph cannot build."""
        if self.rotary_width % 2 or self.rotary_width > self.head_dim:
            raise ConversionError(f"RoPE over {self.rotary_width} of a head's {self.head_dim} dimensions: rotary "
                                  "positions need pairs, within the head", source=source)  # fmt: skip
        if self.linear_attention is not None:
            self.linear_attention.check(source)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConversionError(
                f"{self.num_attention_heads} query heads do not group over {self.num_key_value_heads} key/value heads",
                source=source,
            )
        self._check_layers(source)
        if self.activation not in ACTIVATIONS:
            raise ConversionError(f"activation {self.activation!r} is not one of {sorted(ACTIVATIONS)}", source=source)
        factors = self.rope_frequency_factors
        if factors and (len(factors) != self.rotary_width // 2 or min(factors) <= 0):
            raise ConversionError(f"{len(factors)} RoPE frequency factors for {self.head_dim // 2} pairs of head "
                                  "dimensions, or one not positive", source=source)  # fmt: skip
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ConversionError(
                f"RoPE type {rope_type!r} is not supported; expected one of {sorted(ROPE_TYPES)}", source=source
            )

    def _check_layers(self, source: str) -> None:
        """ConversionError for per-layer options that do not fit the layers: one value per layer, query heads that
        group over each layer's key/value heads, a layer sharing the cache of an earlier one of its shape."""
        for per_layer in (self.layer_windows, self.layer_head_dims, self.layer_kv_heads, self.layer_intermediate_sizes,
                          self.kv_sources):  # fmt: skip
            if per_layer and len(per_layer) != self.num_hidden_layers:
                raise ConversionError(f"{len(per_layer)} per-layer values for {self.num_hidden_layers} layers",
                                      source=source)  # fmt: skip
        for layer in range(self.num_hidden_layers):
            if self.num_attention_heads % self.kv_heads_of(layer):
                raise ConversionError(f"layer {layer}: {self.num_attention_heads} query heads do not group over "
                                      f"{self.kv_heads_of(layer)} key/value heads", source=source)  # fmt: skip
            shared = self.kv_source(layer)
            if shared != layer and not (
                shared < layer and self.caches(shared) and self.head_dim_of(shared) == self.head_dim_of(layer)
                and self.kv_heads_of(shared) == self.kv_heads_of(layer)
            ):  # fmt: skip
                raise ConversionError(f"layer {layer} cannot share the keys and values of layer {shared}",
                                      source=source)  # fmt: skip

    def to_json(self, special_ids: Mapping[str, Any], dtype: str, shape: DecoderShape) -> dict[str, Any]:
        """The converted directory's `config.json`: transformers' names, the dtype of the graph's key/value cache and
        the graph's shape, plus the checkpoint's special token ids."""
        return {
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": dtype,
            "sie_graph": shape.value,
            **(self.linear_attention.to_json() if self.linear_attention is not None else {}),
            **({KV_CACHE_LAYERS: {str(layer): list(shape) for layer, shape in self.cache_layers().items()}}
               if self.layer_head_dims or self.layer_kv_heads or self.kv_sources else {}),
            **special_ids,
        }  # fmt: skip


def rope_frequencies(
    config: DecoderConfig, table: str = "global", head_dim: int | None = None
) -> tuple[np.ndarray, float]:
    """The inverse frequency of each pair of head dimensions ([head_dim / 2], float64) and the factor cos and sin are
    scaled by, for the config's RoPE type, as transformers' `modeling_rope_utils` computes them; the `local` table
    (the windowed layers', where they have their own base) is unscaled. `head_dim`: the heads of the layers reading
    the table, where they differ from the config's (Gemma 4's full-attention layers)."""
    parameters = config.rope_scaling if table == "global" else {}
    theta = config.rope_theta if table == "global" else float(config.local_rope_theta or config.rope_theta)
    rope_type = parameters.get("rope_type", "default")
    dim = config.rotary_dim or head_dim or config.head_dim
    if rope_type == "proportional":
        return _proportional_frequencies(parameters, theta, dim), 1.0
    inverse = _inverse_frequencies(config, table, theta, dim)
    if rope_type == "default":
        return inverse, 1.0
    factor = float(parameters["factor"])
    if rope_type == "linear":
        return inverse / factor, 1.0
    original = float(parameters.get("original_max_position_embeddings") or config.max_position_embeddings)
    if rope_type == "llama3":
        low, high = float(parameters["low_freq_factor"]), float(parameters["high_freq_factor"])
        wavelength = 2 * math.pi / inverse
        scaled = np.where(wavelength > original / low, inverse / factor, inverse)
        smooth = (original / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= original / high) & (wavelength <= original / low)
        return np.where(medium, smoothed, scaled), 1.0
    return _yarn_frequencies(parameters, inverse, theta, dim, original)


def _yarn_frequencies(
    parameters: Mapping[str, Any], inverse: np.ndarray, theta: float, dim: int, original: float
) -> tuple[np.ndarray, float]:
    """YaRN: interpolation below a band of dimensions, extrapolation above it, a linear ramp between; and the factor
    cos and sin are scaled by."""
    factor = float(parameters["factor"])
    attention_factor = parameters.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast = parameters.get("beta_fast") or 32
    beta_slow = parameters.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low_dim, high_dim = correction_dim(beta_fast), correction_dim(beta_slow)
    if parameters.get("truncate", True):
        low_dim, high_dim = math.floor(low_dim), math.ceil(high_dim)
    low_dim, high_dim = max(low_dim, 0), min(high_dim, dim - 1)
    if low_dim == high_dim:
        high_dim += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low_dim) / (high_dim - low_dim), 0, 1)
    extrapolation = 1 - ramp
    return inverse / factor * (1 - extrapolation) + inverse * extrapolation, float(attention_factor)


def _proportional_frequencies(parameters: Mapping[str, Any], theta: float, dim: int) -> np.ndarray:
    """Gemma 4's `proportional` RoPE: the first `partial_rotary_factor` of the pairs rotate at the whole head's
    frequencies theta ** (-2i / d), the others not at all (frequency 0); all divided by `factor`."""
    angles = int(float(parameters.get("partial_rotary_factor", 1.0)) * dim // 2)
    inverse = np.zeros(dim // 2, dtype=np.float64)
    inverse[:angles] = 1.0 / theta ** (np.arange(0, 2 * angles, 2, dtype=np.float64) / dim)
    return inverse / float(parameters.get("factor", 1.0))


def _inverse_frequencies(config: DecoderConfig, table: str, theta: float, dim: int) -> np.ndarray:
    """theta ** (-2i / d) for each pair i of the d rotated dimensions, divided by llama.cpp's frequency factors in the
    global table."""
    inverse = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if table == "global" and config.rope_frequency_factors:
        return inverse / np.asarray(config.rope_frequency_factors, dtype=np.float64)
    return inverse


# --- weights ----------------------------------------------------------------------------------------------------------


class DecoderWeights:
    """A decoder's tensors under transformers' names (`model.layers.{i}.self_attn.q_proj.weight`, …) in its layout,
    float32, each read when the graph builder asks for it and checked against the config's shape. `load(name)`
    reads one tensor by that name and `has(name)` says whether the source holds it; a source with other names
    (GGUF) translates in them."""

    def __init__(
        self, config: DecoderConfig, load: Callable[[str], np.ndarray], has: Callable[[str], bool], source: str
    ) -> None:
        self.config = config
        self._load = load
        self._has = has
        self.source = source

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        array = self._load(name)
        if array.shape != shape:
            raise ConversionError(
                f"shape {list(array.shape)} does not match the config's {list(shape)}", source=self.source, tensor=name
            )
        return array

    def has(self, name: str) -> bool:
        return self._has(name)


# --- graph ------------------------------------------------------------------------------------------------------------

BATCH, SEQUENCE, PAST, TOTAL = "batch", "sequence", "past_sequence", "total_sequence"


@attrs.frozen
class Precision:
    """The dtype of a graph's weights, matrix products and key/value cache."""

    name: str
    numpy: type[np.floating]
    onnx: int


PRECISIONS: Final[dict[str, Precision]] = {
    "float32": Precision("float32", np.float32, TensorProto.FLOAT),
    "float16": Precision("float16", np.float16, TensorProto.FLOAT16),
}
# Added (in float32, whatever the precision) to the scores of keys a query must not see: exp() of it is exactly 0,
# and it stays finite, so a row with no visible key (a left-padding query) gives a uniform softmax, not NaN.
MASK_NEGATIVE: Final = float(np.finfo(np.float32).min)


def precision_named(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ConversionError(f"unknown precision {name!r}; expected one of {sorted(PRECISIONS)}")
    return PRECISIONS[name]


def decoder_inputs(config: DecoderConfig, precision: Precision, shape: DecoderShape) -> list[onnx.ValueInfoProto]:
    if shape is DecoderShape.HIDDEN:
        return [tensor_info(INPUT_IDS, TensorProto.INT64, [BATCH, SEQUENCE]),
                tensor_info(ATTENTION_MASK, TensorProto.INT64, [BATCH, SEQUENCE])]  # fmt: skip
    return [
        tensor_info(INPUT_IDS, TensorProto.INT64, [BATCH, SEQUENCE]),
        tensor_info(ATTENTION_MASK, TensorProto.INT64, [BATCH, TOTAL]),
        tensor_info(POSITION_IDS, TensorProto.INT64, [BATCH, SEQUENCE]),
        *_cache_infos(config, precision, past=True),
    ]


def decoder_outputs(config: DecoderConfig, precision: Precision, shape: DecoderShape) -> list[onnx.ValueInfoProto]:
    if shape is DecoderShape.HIDDEN:
        return [tensor_info(HIDDEN_STATE, TensorProto.FLOAT, [BATCH, SEQUENCE, config.hidden_size])]
    return [tensor_info(LOGITS, TensorProto.FLOAT, [BATCH, 1, config.vocab_size]),
            *_cache_infos(config, precision, past=False)]  # fmt: skip


def _cache_infos(config: DecoderConfig, precision: Precision, past: bool) -> list[onnx.ValueInfoProto]:
    """The cache a generation graph takes (`past`: `past_key_values.*`, `past` tokens long) or gives (`present.*`,
    `past + sequence`), layer by layer: a caching layer's keys and values, a linear-attention layer's two states."""
    length = PAST if past else TOTAL
    key_name, value_name = (past_key_name, past_value_name) if past else (present_key_name, present_value_name)
    infos = []
    for layer in range(config.num_hidden_layers):
        if not config.attends(layer):
            infos.extend(state_inputs(config.linear_attention, layer, past=past))
        elif config.caches(layer):
            shape = [BATCH, config.kv_heads_of(layer), length, config.head_dim_of(layer)]
            infos += [tensor_info(key_name(layer), precision.onnx, shape),
                      tensor_info(value_name(layer), precision.onnx, shape)]  # fmt: skip
    return infos


@attrs.frozen
class _Shared:
    """Tensors computed once per run and read by every layer."""

    # per rotary table (`global`, `local`) and head size: cos and sin [B or 1, 1, S, head_dim], sin's first half
    # negated (rotate_half(x) * sin == swap_halves(x) * sin)
    rotary: dict[tuple[str, int], tuple[str, str]]
    biases: dict[int | None, str]  # float32 [B, 1, 1, S, T] per window: 0 where a query sees a key, else negative
    # per caching layer, its keys and values [B, kv_heads, T, head_dim], as the layers sharing them read them
    keys_values: dict[int, tuple[str, str]] = attrs.field(factory=dict)
    per_layer_inputs: str = ""  # Gemma 4's [B*S, layers, per_layer_input_size] float32, where the model has them


class _Decoder:
    """Emits the decoder into a GraphBuilder; weights are read layer by layer as the nodes are added."""

    def __init__(
        self,
        builder: GraphBuilder,
        config: DecoderConfig,
        weights: DecoderWeights,
        precision: Precision,
        shape: DecoderShape,
        hidden_name: str = HIDDEN_STATE,
    ) -> None:
        self.b = builder
        self.hidden_name = hidden_name
        self.config = config
        self.weights = weights
        self.precision = precision
        self.cached = shape is DecoderShape.GENERATE
        self._shapes: dict[tuple[int, ...], str] = {}
        self._last_only = False  # the run's last position only, from the first layer that shares a cache on
        if self.cached and not config.causal:
            raise ConversionError("a model that attends both ways (an embedding model) cannot generate")

    def build(self) -> str:
        """The graph; returns its output's name (the hidden states, or the logits)."""
        b, cfg = self.b, self.config
        embeddings = self.weights.tensor("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))
        table = b.weight("model.embed_tokens.weight", embeddings, self.precision.numpy)
        x = self.to_float(b.op("Gather", [table, INPUT_IDS], "model.embed_tokens"), "model.embed_tokens.float")
        if cfg.embedding_multiplier != 1.0:
            x = b.op("Mul", [x, b.const(cfg.embedding_multiplier, np.float32)], "model.embed_tokens.scaled")
        # The residual stream is a [B*S, hidden] matrix: every projection is one 2-D product (a Gemm with its bias),
        # which onnxruntime runs faster than the same product over [B, S, hidden].
        x = b.op("Reshape", [x, b.const([-1, cfg.hidden_size])], "model.embed_tokens.rows")
        positions = POSITION_IDS if self.cached else self._positions()
        layers = range(cfg.num_hidden_layers)
        attending = [layer for layer in layers if cfg.attends(layer)]
        tables = {(cfg.rope_of(layer), cfg.head_dim_of(layer)) for layer in attending}
        rotary = {(table, d): self._rotary(positions, table, d) for table, d in sorted(tables)}
        biases = {window: self._attention_bias(window) for window in {cfg.window(layer) for layer in attending}}
        per_layer_inputs = self._per_layer_inputs(x) if cfg.per_layer_input_size else ""
        shared = _Shared(rotary, biases, per_layer_inputs=per_layer_inputs)
        unpadded = row_mask(b) if cfg.linear_attention is not None else ""
        last_only_from = self._first_of_shared_tail() if self.cached else None
        for layer in layers:
            if layer == last_only_from:
                x, shared = self._last_positions(x, shared)
            x = self._layer(x, layer, shared, unpadded)
        final = self.norm_weight("model.norm.weight")
        hidden = b.op("Reshape", [self.rms_norm(x, final, "model.norm"), self.sequence_shape(cfg.hidden_size)],
                      self.hidden_name if not self.cached else "model.norm.sequences")  # fmt: skip
        if not self.cached:
            return hidden
        hidden = self.to_compute(hidden, "model.norm.cast")
        if cfg.tie_word_embeddings:
            head = table
        else:
            output = self.weights.tensor("lm_head.weight", (cfg.vocab_size, cfg.hidden_size))
            head = self.weight("lm_head.weight", output)
        # The last position only (left padding keeps every row's last token there).
        last = b.op("Slice", [hidden, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1])], "lm_head.last")
        rows = b.op("Reshape", [last, b.const([-1, cfg.hidden_size])], "lm_head.rows")
        logits = self.to_float(b.op("Gemm", [rows, head], "lm_head", transB=1), "lm_head.float")
        if cfg.logits_divisor != 1.0:
            logits = b.op("Div", [logits, b.const(cfg.logits_divisor, np.float32)], "lm_head.divided")
        if cfg.final_logit_softcap is not None:  # cap * tanh(logits / cap)
            cap = b.const(cfg.final_logit_softcap, np.float32)
            capped = b.op("Tanh", [b.op("Div", [logits, cap], "lm_head.cap_div")], "lm_head.cap_tanh")
            logits = b.op("Mul", [capped, cap], "lm_head.capped")
        return b.op("Reshape", [logits, b.const([-1, 1, cfg.vocab_size])], LOGITS)

    def _layer(self, x: str, layer: int, shared: _Shared, unpadded: str) -> str:
        """One decoder layer: attention (or a gated delta rule) and the MLP, each with its residual; Gemma 4's
        per-layer input block and layer scalar after them."""
        b, cfg = self.b, self.config
        if cfg.attends(layer):
            x = self._attention(x, layer, shared)
        else:
            x = gated_delta_layer(self, x, layer, cfg.linear_attention, unpadded)
        x = self._mlp(x, layer)
        if cfg.per_layer_input_size:
            x = self._per_layer_input(x, layer, shared.per_layer_inputs)
        if cfg.layer_scalars:
            scalar = self.weights.tensor(f"model.layers.{layer}.layer_scalar", (1,)).astype(np.float32)
            x = b.op("Mul", [x, b.weight(f"model.layers.{layer}.layer_scalar", scalar)], f"model.layers.{layer}.scaled")
        return x

    def sequence_shape(self, *widths: int) -> str:
        """[-1, S, *widths]: rows of the residual stream back into sequences (S: this run's input length, or 1 once
        only the last position goes on); one tensor per shape, shared by every layer."""
        if self._last_only:
            return self.b.const([-1, 1, *widths])
        if widths not in self._shapes:
            b = self.b
            sequence = b.op("Shape", [INPUT_IDS], "shape.sequence", start=1, end=2)
            self._shapes[widths] = b.op("Concat", [b.const([-1]), sequence, b.const(list(widths))], "shape.sequences",
                                        axis=0)  # fmt: skip
        return self._shapes[widths]

    def _first_of_shared_tail(self) -> int | None:
        """The first of the last layers that all read earlier layers' caches (Gemma 4's), None without them: past
        it, only the run's last position matters to a generation graph (nothing after it is cached)."""
        cfg, first = self.config, None
        for layer in reversed(range(cfg.num_hidden_layers)):
            if not cfg.attends(layer) or cfg.caches(layer):
                break
            first = layer
        return first

    def _last_positions(self, x: str, shared: _Shared) -> tuple[str, _Shared]:
        """The residual stream and the per-run tensors cut to each row's last position (left padding puts every
        row's last token there), as transformers runs Gemma 4's shared layers on the positions it keeps."""
        b, cfg, name = self.b, self.config, "last_positions"
        end = b.const([np.iinfo(np.int64).max])

        def last(tensor: str, axis: int, label: str) -> str:
            return b.op("Slice", [tensor, b.const([-1]), end, b.const([axis])], f"{name}.{label}")

        rows = last(b.op("Reshape", [x, self.sequence_shape(cfg.hidden_size)], f"{name}.x_seq"), 1, "x")
        x = b.op("Reshape", [rows, b.const([-1, cfg.hidden_size])], f"{name}.x_rows")
        per_layer = shared.per_layer_inputs
        if per_layer:
            layers, size = cfg.num_hidden_layers, cfg.per_layer_input_size
            sequences = b.op("Reshape", [per_layer, self.sequence_shape(layers * size)], f"{name}.ple_seq")
            per_layer = b.op("Reshape", [last(sequences, 1, "ple"), b.const([-1, layers, size])], f"{name}.ple_rows")
        rotary = {key: (last(cos, 2, f"cos_{key[0]}_{key[1]}"), last(sin, 2, f"sin_{key[0]}_{key[1]}"))
                  for key, (cos, sin) in shared.rotary.items()}  # fmt: skip
        biases = {window: last(bias, 3, f"bias_{window}") for window, bias in shared.biases.items()}
        self._last_only = True
        return x, _Shared(rotary, biases, shared.keys_values, per_layer)

    def norm_weight(self, name: str, size: int | None = None) -> np.ndarray:
        """A norm's scale as the graph multiplies by it: Gemma's (1 + weight), everyone else's weight."""
        scale = self.weights.tensor(name, (size or self.config.hidden_size,))
        return scale + np.float32(self.config.norm_offset) if self.config.norm_offset else scale

    def to_compute(self, x: str, name: str) -> str:
        """`x` (float32) in the graph's precision: a Cast in a float16 graph, nothing in a float32 one."""
        if self.precision.onnx == TensorProto.FLOAT:
            return x
        return self.b.op("Cast", [x], name, to=self.precision.onnx)

    def to_float(self, x: str, name: str) -> str:
        if self.precision.onnx == TensorProto.FLOAT:
            return x
        return self.b.op("Cast", [x], name, to=TensorProto.FLOAT)

    def rms_norm(self, x: str, scale: np.ndarray, name: str) -> str:
        """x / sqrt(mean(x²) + eps) * scale in float32, spelled as onnxruntime's SimplifiedLayerNormFusion expects."""
        b = self.b
        squared = b.op("Pow", [x, b.const(2.0, np.float32)], f"{name}.pow")
        mean = b.op("ReduceMean", [squared], f"{name}.mean", axes=[-1], keepdims=1)
        shifted = b.op("Add", [mean, b.const(self.config.rms_norm_eps, np.float32)], f"{name}.add")
        root = b.op("Sqrt", [shifted], f"{name}.sqrt")
        normed = b.op("Div", [x, root], f"{name}.div")
        return b.op("Mul", [normed, b.weight(f"{name}.weight", scale)], name)

    def _positions(self) -> str:
        """[1, S]: 0 … S-1, the positions of a right-padded row's real tokens."""
        b = self.b
        length = b.op("Squeeze", [b.op("Shape", [INPUT_IDS], "positions.s_1d", start=1, end=2), b.const([0])],
                      "positions.s")  # fmt: skip
        steps = b.op("Range", [b.const(0), length, b.const(1)], "positions.range")
        return b.op("Unsqueeze", [steps, b.const([0])], "positions")

    def _rotary(self, positions: str, table: str, head_dim: int) -> tuple[str, str]:
        """cos and (half-negated) sin of position × inverse frequency, duplicated over both halves (HF layout), for
        heads of `head_dim`."""
        b, cfg = self.b, self.config
        name = f"rotary_{table}" if head_dim == cfg.head_dim else f"rotary_{table}_{head_dim}"
        half = (cfg.rotary_dim or head_dim) // 2
        inverse, attention_factor = rope_frequencies(cfg, table, head_dim)
        # transformers computes the frequencies in float32 and the angles from them
        inverse = inverse.astype(np.float32)
        positions = b.op("Cast", [positions], f"{name}.positions", to=TensorProto.FLOAT)
        positions = b.op("Unsqueeze", [positions, b.const([2])], f"{name}.positions_3d")
        angles = b.op("Mul", [positions, b.const(np.concatenate([inverse, inverse]), np.float32)], f"{name}.angles")
        sign = np.concatenate([-np.ones(half), np.ones(half)])
        cos = b.op("Cos", [angles], f"{name}.cos_raw")
        sin = b.op("Sin", [angles], f"{name}.sin_raw")
        if attention_factor != 1.0:
            cos = b.op("Mul", [cos, b.const(attention_factor, np.float32)], f"{name}.cos_scaled")
            sin = b.op("Mul", [sin, b.const(attention_factor, np.float32)], f"{name}.sin_scaled")
        sin = b.op("Mul", [sin, b.const(sign, np.float32)], f"{name}.sin_3d")
        cos = self.to_compute(b.op("Unsqueeze", [cos, b.const([1])], f"{name}.cos_f32"), f"{name}.cos")
        sin = self.to_compute(b.op("Unsqueeze", [sin, b.const([1])], f"{name}.sin_f32"), f"{name}.sin")
        return cos, sin

    def _attention_bias(self, window: int | None) -> str:
        """Causal by cache index (query i of this run sits at past + i), blind to padded keys and, with a sliding
        window, to keys `window` or more tokens back. A model that attends both ways sees every real key, and with
        a window those fewer than `window` tokens away on either side."""
        b = self.b
        name = "mask" if window is None else f"mask_window{window}"
        sequence = b.op("Squeeze", [b.op("Shape", [INPUT_IDS], f"{name}.s_1d", start=1, end=2), b.const([0])],
                        f"{name}.s")  # fmt: skip
        total = b.op("Squeeze", [b.op("Shape", [ATTENTION_MASK], f"{name}.t_1d", start=1, end=2), b.const([0])],
                     f"{name}.t")  # fmt: skip
        past = b.op("Sub", [total, sequence], f"{name}.past")
        one = b.const(1)
        keys = b.op("Range", [b.const(0), total, one], f"{name}.keys")
        queries = b.op(
            "Unsqueeze", [b.op("Range", [past, total, one], f"{name}.queries_1d"), b.const([1])], f"{name}.queries"
        )
        present = b.op("Cast", [ATTENTION_MASK], f"{name}.present_2d", to=TensorProto.BOOL)
        visible = b.op("Unsqueeze", [present, b.const([1, 2, 3])], f"{name}.present")
        if self.config.causal:
            causal = b.op("LessOrEqual", [keys, queries], f"{name}.causal")
            visible = b.op("And", [visible, causal], f"{name}.visible_causal")
        if window is not None:
            recent = b.op("Greater", [keys, b.op("Sub", [queries, b.const(window)], f"{name}.start")],
                          f"{name}.recent")  # fmt: skip
            visible = b.op("And", [visible, recent], f"{name}.windowed")
            if not self.config.causal:
                near = b.op("Less", [keys, b.op("Add", [queries, b.const(window)], f"{name}.end")], f"{name}.near")
                visible = b.op("And", [visible, near], f"{name}.windowed_both")
        zero, negative = b.const(0.0, np.float32), b.const(MASK_NEGATIVE, np.float32)
        return b.op("Where", [visible, zero, negative], f"{name}.bias")

    def _projections(self, layer: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The fused q/k/v projection `[hidden, (heads + 2 * kv_heads) * head_dim]` (q alone on a layer that shares
        another's keys and values; k twice where the values are the keys) and its bias, 1/sqrt(head_dim) folded
        into the query (RoPE is linear, so the scale commutes) unless a q norm follows, which takes it; and the
        output gate's projection `[hidden, heads * head_dim]` where q_proj carries one (Qwen3.5), else None."""
        cfg, w = self.config, self.weights
        prefix = f"model.layers.{layer}.self_attn"
        d, hidden, kv_heads = cfg.head_dim_of(layer), cfg.hidden_size, cfg.kv_heads_of(layer)
        widths = {"q": cfg.num_attention_heads * d, "k": kv_heads * d, "v": kv_heads * d}
        if not cfg.caches(layer):
            del widths["k"], widths["v"]
        stored = {part: "k" if part == "v" and cfg.values_from_keys(layer) else part for part in widths}
        query_scale = np.float32(1.0) if cfg.qk_norm else np.float32(cfg.query_scale)
        weights = [w.tensor(f"{prefix}.{stored[p]}_proj.weight", (width, hidden)) for p, width in widths.items()
                   if p != "q" or not cfg.attention_output_gate]  # fmt: skip
        gate = None
        if cfg.attention_output_gate:  # q_proj holds each head's query then its gate
            query_and_gate = w.tensor(f"{prefix}.q_proj.weight", (2 * widths["q"], hidden))
            query_and_gate = query_and_gate.reshape(cfg.num_attention_heads, 2, d, hidden)
            weights.insert(0, query_and_gate[:, 0].reshape(-1, hidden))
            gate = query_and_gate[:, 1].reshape(-1, hidden).T
        weights[0] = weights[0] * query_scale
        bias = None
        if cfg.qkv_bias:
            biases = [w.tensor(f"{prefix}.{stored[p]}_proj.bias", (width,)) for p, width in widths.items()]
            biases[0] = biases[0] * query_scale
            bias = np.concatenate(biases)
        return np.concatenate(weights, axis=0).T, bias, gate

    def _attention(self, x: str, layer: int, shared: _Shared) -> str:
        b, cfg, name = self.b, self.config, f"model.layers.{layer}.self_attn"
        heads, kv_heads, d = cfg.num_attention_heads, cfg.kv_heads_of(layer), cfg.head_dim_of(layer)
        norm = self.norm_weight(f"model.layers.{layer}.input_layernorm.weight")
        hidden = self.to_compute(self.rms_norm(x, norm, f"model.layers.{layer}.input_layernorm"), f"{name}.input")
        weight, bias, gate = self._projections(layer)
        projected = b.op("MatMul", [hidden, self.weight(f"{name}.qkv_proj.weight", weight)], f"{name}.qkv")
        if bias is not None:
            projected = b.op("Add", [projected, self.weight(f"{name}.qkv_proj.bias", bias)], f"{name}.qkv_biased")
        rotary = shared.rotary[(cfg.rope_of(layer), d)]
        if cfg.caches(layer):
            query, key, value = self._query_key_value(projected, layer, rotary)
            if self.cached:
                key = b.op("Concat", [past_key_name(layer), key], present_key_name(layer), axis=2)
                value = b.op("Concat", [past_value_name(layer), value], present_value_name(layer), axis=2)
            shared.keys_values[layer] = (key, value)
        else:  # the keys and values of the earlier layer it shares (Gemma 4), its own query
            query = b.op("Reshape", [projected, self.sequence_shape(heads, d)], f"{name}.q_heads")  # [B, S, heads, d]
            query = self._head_norm(query, self.norm_weight(f"{name}.q_norm.weight", d) * np.float32(cfg.query_scale),
                                    f"{name}.q_norm")  # fmt: skip
            query = self._rotate(b.op("Transpose", [query], f"{name}.q_t", perm=[0, 2, 1, 3]), rotary, name, d)
            key, value = shared.keys_values[cfg.kv_source(layer)]
        # Grouped-query attention without copying the cache: the query heads of one key/value head form a group
        # axis, and MatMul broadcasts each key/value head over its group.
        groups = heads // kv_heads
        grouped = b.op("Reshape", [query, b.const([0, kv_heads, groups, -1, d])], f"{name}.q_groups")
        key_t = b.op("Transpose", [b.op("Unsqueeze", [key, b.const([2])], f"{name}.k_5d")], f"{name}.k_t",
                     perm=[0, 1, 2, 4, 3])  # fmt: skip
        scores = self.to_float(b.op("MatMul", [grouped, key_t], f"{name}.scores"), f"{name}.scores_f32")
        scores = b.op("Add", [scores, shared.biases[cfg.window(layer)]], f"{name}.masked_scores")
        probs = self.to_compute(b.op("Softmax", [scores], f"{name}.probs", axis=-1), f"{name}.probs_cast")
        value_5d = b.op("Unsqueeze", [value, b.const([2])], f"{name}.v_5d")
        context = b.op("MatMul", [probs, value_5d], f"{name}.context")  # [B, kv, groups, S, d]
        context = b.op("Reshape", [context, b.const([0, heads, -1, d])], f"{name}.context_heads")
        context = b.op("Transpose", [context], f"{name}.context_t", perm=[0, 2, 1, 3])
        context = b.op("Reshape", [context, b.const([-1, heads * d])], f"{name}.context_merged")
        if gate is not None:  # sigmoid(hidden @ gate): Qwen3.5's gate on each head's output
            gate_logits = b.op("MatMul", [hidden, self.weight(f"{name}.gate_proj.weight", gate)], f"{name}.gate")
            gate_values = b.op("Sigmoid", [gate_logits], f"{name}.gate_sigmoid")
            context = b.op("Mul", [context, gate_values], f"{name}.context_gated")
        out = self.projection(context, f"{name}.o_proj", cfg.hidden_size, heads * d, cfg.output_bias)
        out = self.to_float(out, f"{name}.o_proj_f32")
        if cfg.sandwich_norms:
            norm_name = f"model.layers.{layer}.post_attention_layernorm"
            out = self.rms_norm(out, self.norm_weight(f"{norm_name}.weight"), norm_name)
        return self.residual(x, out, f"model.layers.{layer}.attn_residual")

    def _query_key_value(self, qkv: str, layer: int, rotary: tuple[str, str]) -> tuple[str, str, str]:
        """The fused projection's queries, keys and values as heads `[B, heads or kv_heads, S, d]`: q/k normed
        (before the rotation, or after it: HunYuan) where the family does, rotated, values normed where the family
        does (Gemma 4)."""
        b, cfg, name = self.b, self.config, f"model.layers.{layer}.self_attn"
        heads, kv_heads, d = cfg.num_attention_heads, cfg.kv_heads_of(layer), cfg.head_dim_of(layer)
        qkv = b.op("Reshape", [qkv, self.sequence_shape(heads + 2 * kv_heads, d)], f"{name}.qkv_heads")  # [B, S, ., d]
        if cfg.qk_norm and not cfg.qk_norm_after_rotation:
            query, key, value = b.op_multi("Split", [qkv, b.const([heads, kv_heads, kv_heads])],
                                           [f"{name}.q_raw", f"{name}.k_raw", f"{name}.v_raw"], axis=2)  # fmt: skip
            scale = np.float32(cfg.query_scale)
            query = self._head_norm(query, self.norm_weight(f"{name}.q_norm.weight", d) * scale, f"{name}.q_norm")
            key = self._head_norm(key, self.norm_weight(f"{name}.k_norm.weight", d), f"{name}.k_norm")
            qk = b.op("Concat", [query, key], f"{name}.qk_normed", axis=2)
        else:
            qk, value = b.op_multi("Split", [qkv, b.const([heads + kv_heads, kv_heads])], [f"{name}.qk_raw",
                                   f"{name}.v_raw"], axis=2)  # fmt: skip
        if cfg.value_norm:  # an RMSNorm with no scale of its own
            value = self._head_norm(value, np.ones(d, dtype=np.float32), f"{name}.v_norm")
        qk = b.op("Transpose", [qk], f"{name}.qk", perm=[0, 2, 1, 3])  # [B, heads + kv_heads, S, d]
        value = b.op("Transpose", [value], f"{name}.v", perm=[0, 2, 1, 3])
        qk = self._rotate(qk, rotary, name, d)
        query, key = b.op_multi("Split", [qk, b.const([heads, kv_heads])], [f"{name}.q", f"{name}.k"], axis=1)
        if cfg.qk_norm_after_rotation:  # [B, heads, S, d]: the same per-head norm, on rotated heads
            scale = np.float32(cfg.query_scale)
            query = self._head_norm(query, self.norm_weight(f"{name}.q_norm.weight", d) * scale, f"{name}.q_norm")
            key = self._head_norm(key, self.norm_weight(f"{name}.k_norm.weight", d), f"{name}.k_norm")
        return query, key, value

    def residual(self, x: str, out: str, name: str) -> str:
        """x + out (Granite: x + out × residual_multiplier)."""
        if self.config.residual_multiplier != 1.0:
            out = self.b.op("Mul", [out, self.b.const(self.config.residual_multiplier, np.float32)], f"{name}.scaled")
        return self.b.op("Add", [x, out], name)

    def _head_norm(self, x: str, scale: np.ndarray, name: str) -> str:
        """RMSNorm over each head's `head_dim` values of [B, S, heads, d], in float32."""
        normed = self.rms_norm(self.to_float(x, f"{name}.f32"), scale, name)
        return self.to_compute(normed, f"{name}.cast")

    def _rotate(self, x: str, rotary: tuple[str, str], name: str, head_dim: int) -> str:
        """x * cos + rotate_half(x) * sin, with the sign of rotate_half already in the sin table; where RoPE
        rotates part of each head (`rotary_dim`), the rest passes as it is."""
        b, cfg = self.b, self.config
        width = cfg.rotary_dim or head_dim
        half, rest = width // 2, head_dim - width
        cos, sin = rotary
        passed = None
        if rest:
            x, passed = b.op_multi("Split", [x, b.const([width, rest])],
                                   [f"{name}.rot_part", f"{name}.rot_pass"], axis=-1)  # fmt: skip
        first, second = b.op_multi("Split", [x, b.const([half, half])], [f"{name}.rot_a", f"{name}.rot_b"], axis=-1)
        swapped = b.op("Concat", [second, first], f"{name}.rot_swapped", axis=-1)
        rotated = b.op("Add", [b.op("Mul", [x, cos], f"{name}.rot_cos"),
                               b.op("Mul", [swapped, sin], f"{name}.rot_sin")], f"{name}.rotated")  # fmt: skip
        return rotated if passed is None else b.op("Concat", [rotated, passed], f"{name}.rotated_all", axis=-1)

    def _mlp(self, x: str, layer: int) -> str:
        b, cfg, name = self.b, self.config, f"model.layers.{layer}.mlp"
        # the norm before the MLP: Llama's post_attention_layernorm, Gemma's pre_feedforward_layernorm
        norm_name = f"model.layers.{layer}." + ("pre_feedforward_layernorm" if cfg.sandwich_norms
                                                else "post_attention_layernorm")  # fmt: skip
        normed = self.rms_norm(x, self.norm_weight(f"{norm_name}.weight"), norm_name)
        hidden = self.to_compute(normed, f"{name}.input")
        size, width = cfg.intermediate_size_of(layer), cfg.hidden_size
        # gate and up as two products, not one split afterwards: the split would copy [B*S, 2 * intermediate]
        gate, up = (
            self.projection(hidden, f"{name}.{part}_proj", size, width, cfg.mlp_bias) for part in ("gate", "up")
        )
        activated = b.op("Mul", [self._activation(gate, name), up], f"{name}.act")
        out = self.projection(activated, f"{name}.down_proj", width, size, cfg.mlp_bias)
        out = self.to_float(out, f"{name}.down_f32")
        if cfg.sandwich_norms:
            norm_name = f"model.layers.{layer}.post_feedforward_layernorm"
            out = self.rms_norm(out, self.norm_weight(f"{norm_name}.weight"), norm_name)
        return self.residual(x, out, f"model.layers.{layer}.mlp_residual")

    def _per_layer_inputs(self, embedded: str) -> str:
        """Gemma 4's per-layer inputs `[B*S, layers, size]` (float32): each token's row of their own table × sqrt(size),
        plus the RMS-normed projection of its scaled embedding (`embedded`, `[B*S, hidden]`) × hidden^-1/2, the sum
        over sqrt(2)."""
        b, cfg, name = self.b, self.config, "model.per_layer_inputs"
        layers, size = cfg.num_hidden_layers, cfg.per_layer_input_size
        table = self.weights.tensor("model.embed_tokens_per_layer.weight", (cfg.per_layer_vocab_size, layers * size))
        rows = b.op("Gather", [self.weight("model.embed_tokens_per_layer.weight", table), INPUT_IDS], f"{name}.rows")
        rows = b.op("Mul", [self.to_float(rows, f"{name}.rows_f32"), b.const(float(np.float32(size**0.5)), np.float32)],
                    f"{name}.rows_scaled")  # fmt: skip
        rows = b.op("Reshape", [rows, b.const([-1, layers, size])], f"{name}.token")
        projected = self.projection(self.to_compute(embedded, f"{name}.input"), "model.per_layer_model_projection",
                                    layers * size, cfg.hidden_size, False)  # fmt: skip
        projected = b.op("Mul", [self.to_float(projected, f"{name}.projected_f32"),
                                 b.const(cfg.hidden_size**-0.5, np.float32)], f"{name}.projected_scaled")  # fmt: skip
        projected = b.op("Reshape", [projected, b.const([-1, layers, size])], f"{name}.projected")
        norm = self.norm_weight("model.per_layer_projection_norm.weight", size)
        context = self.rms_norm(projected, norm, "model.per_layer_projection_norm")
        summed = b.op("Add", [context, rows], f"{name}.sum")
        return b.op("Mul", [summed, b.const(2.0**-0.5, np.float32)], name)

    def _per_layer_input(self, x: str, layer: int, inputs: str) -> str:
        """Gemma 4's per-layer input block: x + norm(project(act(gate(x)) × this layer's input))."""
        b, cfg, name = self.b, self.config, f"model.layers.{layer}"
        size = cfg.per_layer_input_size
        own = self.to_compute(b.op("Gather", [inputs, b.const(layer)], f"{name}.per_layer_input", axis=1),
                              f"{name}.per_layer_input_cast")  # fmt: skip
        hidden = self.to_compute(x, f"{name}.per_layer_input_gate.input")
        gate = self.projection(hidden, f"{name}.per_layer_input_gate", size, cfg.hidden_size, False)
        gated = b.op("Mul", [self._activation(gate, f"{name}.per_layer_input_gate"), own], f"{name}.per_layer_gated")
        out = self.projection(gated, f"{name}.per_layer_projection", cfg.hidden_size, size, False)
        norm_name = f"{name}.post_per_layer_input_norm"
        out = self.rms_norm(self.to_float(out, f"{name}.per_layer_projection_f32"),
                            self.norm_weight(f"{norm_name}.weight"), norm_name)  # fmt: skip
        return b.op("Add", [x, out], f"{name}.per_layer_residual")

    def projection(self, x: str, name: str, out_features: int, in_features: int, bias: bool) -> str:
        """x @ weight.T (+ its bias, where the config gives the layer one) for the linear layer `name`."""
        weight = self.weights.tensor(f"{name}.weight", (out_features, in_features)).T
        out = self.b.op("MatMul", [x, self.weight(f"{name}.weight", weight)], name)
        if bias:
            bias = self.weight(f"{name}.bias", self.weights.tensor(f"{name}.bias", (out_features,)))
            out = self.b.op("Add", [out, bias], f"{name}.biased")
        return out

    def _activation(self, gate: str, name: str) -> str:
        """SiLU, or GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x³)))."""
        b = self.b
        if self.config.activation == "silu":
            return b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{name}.sigmoid")], f"{name}.silu")
        dtype = self.precision.numpy
        cubed = b.op("Mul", [b.op("Mul", [gate, gate], f"{name}.x2"), gate], f"{name}.x3")
        inner = b.op("Add", [gate, b.op("Mul", [cubed, b.const(0.044715, dtype)], f"{name}.cx3")], f"{name}.inner")
        tanh = b.op("Tanh", [b.op("Mul", [inner, b.const(math.sqrt(2 / math.pi), dtype)], f"{name}.scaled")],
                    f"{name}.tanh")  # fmt: skip
        half = b.op("Mul", [gate, b.const(0.5, dtype)], f"{name}.half")
        return b.op("Mul", [half, b.op("Add", [tanh, b.const(1.0, dtype)], f"{name}.one_plus")], f"{name}.gelu")

    def weight(self, name: str, array: np.ndarray) -> str:
        return self.b.weight(name, array, self.precision.numpy)


def build_decoder(
    builder: GraphBuilder,
    config: DecoderConfig,
    weights: DecoderWeights,
    precision: Precision,
    shape: DecoderShape = DecoderShape.GENERATE,
    hidden_name: str = HIDDEN_STATE,
) -> str:
    """Add the whole decoder to `builder`; its outputs carry the names `decoder_outputs` declares, but for a `hidden`
    graph whose states a head reads on (`hidden_name`: NV-Embed's latent attention). Returns the hidden states' (or
    the logits') tensor name."""
    return _Decoder(builder, config, weights, precision, shape, hidden_name).build()
