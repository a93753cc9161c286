"""The llama decoder family, config + weights + graph: `LlamaConfig` (the architecture numbers from GGUF metadata,
`llama.*` keys, checked for what the builder cannot handle, and the Hugging Face style `config.json` the causal-LM
adapter reads), `LlamaWeights` (GGUF tensors dequantized to float32 in `[in, out]` layout, llama.cpp's q/k row
permutation undone) and the decoder as an opset-17 ONNX graph with a key/value cache.

The graph: token embeddings, RMSNorm blocks with grouped-query attention and rotary positions (rotate-half), SwiGLU
MLPs, the final norm and the output head. Inputs: `input_ids [batch, sequence]`, `attention_mask [batch, past +
sequence]` (1 = real token, left padding allowed), `position_ids [batch, sequence]`, `past_key_values.{i}.key|value
[batch, kv_heads, past, head_dim]`. Outputs: `logits [batch, 1, vocab]` (float32), the last position's only (all a
decoder samples from: a prefill pays the output head once per prompt, not once per prompt token), and
`present.{i}.key|value [batch, kv_heads, past + sequence, head_dim]`. In a float16 graph the weights, matrix
products and cache are float16 while the residual stream, norms, softmax and logits stay float32. Standard ONNX
operators only; onnxruntime fuses the RMSNorm and the transposed-key product at load time.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import GgufFile
from sie.worker.convert.graph_builder import GraphBuilder, tensor_info
from sie.worker.convert.names import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    POSITION_IDS,
    past_key_name,
    past_value_name,
    present_key_name,
    present_value_name,
)

# --- config -----------------------------------------------------------------------------------------------------------

SUPPORTED_ARCHITECTURES = frozenset({"llama"})
DEFAULT_ROPE_BASE = 10_000.0
DEFAULT_RMS_EPS = 1e-5


@attrs.frozen
class LlamaConfig:
    """One llama decoder's shape. `head_dim` is hidden / heads; RoPE rotates all of it."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = DEFAULT_ROPE_BASE
    rms_norm_eps: float = DEFAULT_RMS_EPS
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """Query heads that share one key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    def to_json(self, special_ids: dict[str, int | None], dtype: str) -> dict[str, Any]:
        """`config.json` in Hugging Face LlamaConfig names, plus the dtype of the graph's key/value cache."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
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
            **special_ids,
        }


def llama_config(gguf: GgufFile) -> LlamaConfig:
    """Read and check the `llama.*` metadata of `gguf`; errors name the file and the key."""
    architecture = gguf.architecture
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"architecture {architecture!r} is not supported; expected one of {sorted(SUPPORTED_ARCHITECTURES)}",
            source=str(gguf.path),
        )
    if gguf.value("llama.rope.scaling.type", "none") not in ("none", None):
        raise ConversionError("RoPE scaling is not supported", source=str(gguf.path))
    embeddings = gguf.shape("token_embd.weight")
    config = LlamaConfig(
        hidden_size=_positive(gguf, "llama.embedding_length"),
        intermediate_size=_positive(gguf, "llama.feed_forward_length"),
        num_hidden_layers=_positive(gguf, "llama.block_count"),
        num_attention_heads=_positive(gguf, "llama.attention.head_count"),
        num_key_value_heads=_positive(gguf, "llama.attention.head_count_kv"),
        vocab_size=int(gguf.value("llama.vocab_size", embeddings[0])),
        max_position_embeddings=_positive(gguf, "llama.context_length"),
        rope_theta=float(gguf.value("llama.rope.freq_base", DEFAULT_ROPE_BASE)),
        rms_norm_eps=float(gguf.value("llama.attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS)),
        tie_word_embeddings="output.weight" not in gguf,
    )
    _check(gguf, config)
    return config


def _positive(gguf: GgufFile, key: str) -> int:
    value = gguf.value(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConversionError(f"metadata key {key!r} must be a positive integer, got {value!r}", source=str(gguf.path))
    return value


def _check(gguf: GgufFile, config: LlamaConfig) -> None:
    source = str(gguf.path)
    if config.hidden_size % config.num_attention_heads or config.head_dim % 2:
        raise ConversionError(
            f"hidden size {config.hidden_size} does not split into {config.num_attention_heads} heads of even size",
            source=source,
        )
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConversionError(
            f"{config.num_attention_heads} query heads do not group over {config.num_key_value_heads} key/value heads",
            source=source,
        )
    rope_dims = gguf.value("llama.rope.dimension_count", config.head_dim)
    if rope_dims != config.head_dim:
        raise ConversionError(f"partial RoPE ({rope_dims} of {config.head_dim} dims) is not supported", source=source)


# --- weights ----------------------------------------------------------------------------------------------------------


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(weights, n_head)`: row `h*d + 2j + c` goes back to `h*d + c*d/2 + j`."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


class LlamaWeights:
    """Reads each tensor when the graph builder asks for it; shapes are checked against the config."""

    def __init__(self, gguf: GgufFile, config: LlamaConfig) -> None:
        self.gguf = gguf
        self.config = config

    def _load(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        array = self.gguf.load(name)
        if array.shape != shape:
            raise ConversionError(
                f"shape {list(array.shape)} does not match the config's {list(shape)}",
                source=str(self.gguf.path),
                tensor=name,
            )
        return array

    def embeddings(self) -> np.ndarray:
        """`[vocab, hidden]`: the token table, which is also the output head when the embeddings are tied."""
        return self._load("token_embd.weight", (self.config.vocab_size, self.config.hidden_size))

    def output_head(self) -> np.ndarray:
        """`[vocab, hidden]` of an untied output head."""
        return self._load("output.weight", (self.config.vocab_size, self.config.hidden_size))

    def norm(self, layer: int, kind: str) -> np.ndarray:
        """A layer's RMSNorm scale `[hidden]`: `attn_norm` (before attention) or `ffn_norm` (before the MLP)."""
        return self._load(f"blk.{layer}.{kind}.weight", (self.config.hidden_size,))

    def final_norm(self) -> np.ndarray:
        return self._load("output_norm.weight", (self.config.hidden_size,))

    def qkv(self, layer: int) -> np.ndarray:
        """`[hidden, (heads + 2 * kv_heads) * head_dim]`: query, key and value side by side, query and key in the
        rotate-half layout, 1/sqrt(head_dim) folded into the query (RoPE is linear, so the scale commutes)."""
        cfg = self.config
        hidden, d = cfg.hidden_size, cfg.head_dim
        query = self._load(f"blk.{layer}.attn_q.weight", (cfg.num_attention_heads * d, hidden))
        key = self._load(f"blk.{layer}.attn_k.weight", (cfg.num_key_value_heads * d, hidden))
        value = self._load(f"blk.{layer}.attn_v.weight", (cfg.num_key_value_heads * d, hidden))
        query = unpermute_rows(query, cfg.num_attention_heads) * np.float32(1.0 / math.sqrt(d))
        key = unpermute_rows(key, cfg.num_key_value_heads)
        return np.concatenate([query, key, value], axis=0).T

    def attention_output(self, layer: int) -> np.ndarray:
        """`[heads * head_dim, hidden]`."""
        cfg = self.config
        return self._load(
            f"blk.{layer}.attn_output.weight", (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim)
        ).T

    def gate_up(self, layer: int) -> np.ndarray:
        """`[hidden, 2 * intermediate]`: the SwiGLU gate and up projections side by side."""
        cfg = self.config
        shape = (cfg.intermediate_size, cfg.hidden_size)
        gate = self._load(f"blk.{layer}.ffn_gate.weight", shape)
        up = self._load(f"blk.{layer}.ffn_up.weight", shape)
        return np.concatenate([gate, up], axis=0).T

    def down(self, layer: int) -> np.ndarray:
        """`[intermediate, hidden]`."""
        cfg = self.config
        return self._load(f"blk.{layer}.ffn_down.weight", (cfg.hidden_size, cfg.intermediate_size)).T


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


def decoder_inputs(config: LlamaConfig, precision: Precision) -> list[onnx.ValueInfoProto]:
    cache_shape = [BATCH, config.num_key_value_heads, PAST, config.head_dim]
    inputs = [
        tensor_info(INPUT_IDS, TensorProto.INT64, [BATCH, SEQUENCE]),
        tensor_info(ATTENTION_MASK, TensorProto.INT64, [BATCH, TOTAL]),
        tensor_info(POSITION_IDS, TensorProto.INT64, [BATCH, SEQUENCE]),
    ]
    for layer in range(config.num_hidden_layers):
        inputs.append(tensor_info(past_key_name(layer), precision.onnx, cache_shape))
        inputs.append(tensor_info(past_value_name(layer), precision.onnx, cache_shape))
    return inputs


def decoder_outputs(config: LlamaConfig, precision: Precision) -> list[onnx.ValueInfoProto]:
    cache_shape = [BATCH, config.num_key_value_heads, TOTAL, config.head_dim]
    outputs = [tensor_info(LOGITS, TensorProto.FLOAT, [BATCH, 1, config.vocab_size])]
    for layer in range(config.num_hidden_layers):
        outputs.append(tensor_info(present_key_name(layer), precision.onnx, cache_shape))
        outputs.append(tensor_info(present_value_name(layer), precision.onnx, cache_shape))
    return outputs


@attrs.frozen
class _Shared:
    """Tensors computed once per run and read by every layer."""

    cos: str  # [B, 1, S, head_dim]
    sin: str  # [B, 1, S, head_dim], its first half negated: rotate_half(x) * sin == swap_halves(x) * sin
    bias: str  # float32 [B, 1, 1, S, T]: 0 where a query sees a key, MASK_NEGATIVE elsewhere


class _Decoder:
    """Emits the decoder into a GraphBuilder; weights are read layer by layer as the nodes are added."""

    def __init__(self, builder: GraphBuilder, config: LlamaConfig, weights: LlamaWeights, precision: Precision):
        self.b = builder
        self.config = config
        self.weights = weights
        self.precision = precision

    def build(self) -> None:
        b, cfg = self.b, self.config
        table = b.weight("model.embed_tokens.weight", self.weights.embeddings(), self.precision.numpy)
        x = self._to_float(b.op("Gather", [table, INPUT_IDS], "model.embed_tokens"), "model.embed_tokens.float")
        shared = _Shared(*self._rotary(), self._attention_bias())
        for layer in range(cfg.num_hidden_layers):
            x = self._attention(x, layer, shared)
            x = self._mlp(x, layer)
        hidden = self._to_compute(self._rms_norm(x, self.weights.final_norm(), "model.norm"), "model.norm.cast")
        head = table if cfg.tie_word_embeddings else self._weight("lm_head.weight", self.weights.output_head())
        # The last position only (left padding keeps every row's last token there).
        last = b.op("Slice", [hidden, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1])], "lm_head.last")
        rows = b.op("Reshape", [last, b.const([-1, cfg.hidden_size])], "lm_head.rows")
        logits = self._to_float(b.op("Gemm", [rows, head], "lm_head", transB=1), "lm_head.float")
        b.op("Reshape", [logits, b.const([-1, 1, cfg.vocab_size])], LOGITS)

    def _to_compute(self, x: str, name: str) -> str:
        """`x` (float32) in the graph's precision: a Cast in a float16 graph, nothing in a float32 one."""
        if self.precision.onnx == TensorProto.FLOAT:
            return x
        return self.b.op("Cast", [x], name, to=self.precision.onnx)

    def _to_float(self, x: str, name: str) -> str:
        if self.precision.onnx == TensorProto.FLOAT:
            return x
        return self.b.op("Cast", [x], name, to=TensorProto.FLOAT)

    def _rms_norm(self, x: str, scale: np.ndarray, name: str) -> str:
        """x / sqrt(mean(x²) + eps) * scale in float32, spelled as onnxruntime's SimplifiedLayerNormFusion expects."""
        b = self.b
        squared = b.op("Pow", [x, b.const(2.0, np.float32)], f"{name}.pow")
        mean = b.op("ReduceMean", [squared], f"{name}.mean", axes=[-1], keepdims=1)
        shifted = b.op("Add", [mean, b.const(self.config.rms_norm_eps, np.float32)], f"{name}.add")
        root = b.op("Sqrt", [shifted], f"{name}.sqrt")
        normed = b.op("Div", [x, root], f"{name}.div")
        return b.op("Mul", [normed, b.weight(f"{name}.weight", scale)], name)

    def _rotary(self) -> tuple[str, str]:
        """cos and (half-negated) sin of position × inverse frequency, duplicated over both halves (HF layout)."""
        b, cfg = self.b, self.config
        half = cfg.head_dim // 2
        inverse = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim))
        positions = b.op("Cast", [POSITION_IDS], "rotary.positions", to=TensorProto.FLOAT)
        positions = b.op("Unsqueeze", [positions, b.const([2])], "rotary.positions_3d")
        angles = b.op("Mul", [positions, b.const(np.concatenate([inverse, inverse]), np.float32)], "rotary.angles")
        sign = np.concatenate([-np.ones(half), np.ones(half)])
        cos = b.op("Cos", [angles], "rotary.cos_3d")
        sin = b.op("Mul", [b.op("Sin", [angles], "rotary.sin_raw"), b.const(sign, np.float32)], "rotary.sin_3d")
        cos = self._to_compute(b.op("Unsqueeze", [cos, b.const([1])], "rotary.cos_f32"), "rotary.cos")
        sin = self._to_compute(b.op("Unsqueeze", [sin, b.const([1])], "rotary.sin_f32"), "rotary.sin")
        return cos, sin

    def _attention_bias(self) -> str:
        """Causal by cache index (query i of this run sits at past + i) and blind to padded keys."""
        b = self.b
        sequence = b.op("Squeeze", [b.op("Shape", [INPUT_IDS], "mask.s_1d", start=1, end=2), b.const([0])], "mask.s")
        total = b.op("Squeeze", [b.op("Shape", [ATTENTION_MASK], "mask.t_1d", start=1, end=2), b.const([0])], "mask.t")
        past = b.op("Sub", [total, sequence], "mask.past")
        one = b.const(1)
        keys = b.op("Range", [b.const(0), total, one], "mask.keys")
        queries = b.op(
            "Unsqueeze", [b.op("Range", [past, total, one], "mask.queries_1d"), b.const([1])], "mask.queries"
        )
        causal = b.op("LessOrEqual", [keys, queries], "mask.causal")
        present = b.op("Cast", [ATTENTION_MASK], "mask.present_2d", to=TensorProto.BOOL)
        present = b.op("Unsqueeze", [present, b.const([1, 2, 3])], "mask.present")
        visible = b.op("And", [causal, present], "mask.visible")
        zero, negative = b.const(0.0, np.float32), b.const(MASK_NEGATIVE, np.float32)
        return b.op("Where", [visible, zero, negative], "mask.bias")

    def _attention(self, x: str, layer: int, shared: _Shared) -> str:
        b, cfg, name = self.b, self.config, f"model.layers.{layer}.self_attn"
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        normed = self._rms_norm(x, self.weights.norm(layer, "attn_norm"), f"model.layers.{layer}.input_layernorm")
        hidden = self._to_compute(normed, f"{name}.input")
        qkv = b.op("MatMul", [hidden, self._weight(f"{name}.qkv_proj.weight", self.weights.qkv(layer))], f"{name}.qkv")
        qkv = b.op("Reshape", [qkv, b.const([0, 0, heads + 2 * kv_heads, d])], f"{name}.qkv_heads")
        qkv = b.op("Transpose", [qkv], f"{name}.qkv_t", perm=[0, 2, 1, 3])  # [B, heads, S, d]
        qk, value = b.op_multi(
            "Split", [qkv, b.const([heads + kv_heads, kv_heads])], [f"{name}.qk", f"{name}.v"], axis=1
        )
        qk = self._rotate(qk, shared, name)
        query, key = b.op_multi("Split", [qk, b.const([heads, kv_heads])], [f"{name}.q", f"{name}.k"], axis=1)
        key = b.op("Concat", [past_key_name(layer), key], present_key_name(layer), axis=2)
        value = b.op("Concat", [past_value_name(layer), value], present_value_name(layer), axis=2)
        # Grouped-query attention without copying the cache: the query heads of one key/value head form a group
        # axis, and MatMul broadcasts each key/value head over its group.
        grouped = b.op("Reshape", [query, b.const([0, kv_heads, cfg.query_groups, -1, d])], f"{name}.q_groups")
        key_t = b.op("Transpose", [b.op("Unsqueeze", [key, b.const([2])], f"{name}.k_5d")], f"{name}.k_t",
                     perm=[0, 1, 2, 4, 3])  # fmt: skip
        scores = self._to_float(b.op("MatMul", [grouped, key_t], f"{name}.scores"), f"{name}.scores_f32")
        scores = b.op("Add", [scores, shared.bias], f"{name}.masked_scores")
        probs = self._to_compute(b.op("Softmax", [scores], f"{name}.probs", axis=-1), f"{name}.probs_cast")
        value_5d = b.op("Unsqueeze", [value, b.const([2])], f"{name}.v_5d")
        context = b.op("MatMul", [probs, value_5d], f"{name}.context")  # [B, kv, groups, S, d]
        context = b.op("Reshape", [context, b.const([0, heads, -1, d])], f"{name}.context_heads")
        context = b.op("Transpose", [context], f"{name}.context_t", perm=[0, 2, 1, 3])
        context = b.op("Reshape", [context, b.const([0, 0, heads * d])], f"{name}.context_merged")
        out = b.op("MatMul", [context, self._weight(f"{name}.o_proj.weight", self.weights.attention_output(layer))],
                   f"{name}.o_proj")  # fmt: skip
        return b.op("Add", [x, self._to_float(out, f"{name}.o_proj_f32")], f"model.layers.{layer}.attn_residual")

    def _rotate(self, x: str, shared: _Shared, name: str) -> str:
        """x * cos + rotate_half(x) * sin, with the sign of rotate_half already in `shared.sin`."""
        b, half = self.b, self.config.head_dim // 2
        first, second = b.op_multi("Split", [x, b.const([half, half])], [f"{name}.rot_a", f"{name}.rot_b"], axis=-1)
        swapped = b.op("Concat", [second, first], f"{name}.rot_swapped", axis=-1)
        return b.op("Add", [b.op("Mul", [x, shared.cos], f"{name}.rot_cos"),
                            b.op("Mul", [swapped, shared.sin], f"{name}.rot_sin")], f"{name}.rotated")  # fmt: skip

    def _mlp(self, x: str, layer: int) -> str:
        b, cfg, name = self.b, self.config, f"model.layers.{layer}.mlp"
        normed = self._rms_norm(
            x, self.weights.norm(layer, "ffn_norm"), f"model.layers.{layer}.post_attention_layernorm"
        )
        hidden = self._to_compute(normed, f"{name}.input")
        gate_up = b.op("MatMul", [hidden, self._weight(f"{name}.gate_up_proj.weight", self.weights.gate_up(layer))],
                       f"{name}.gate_up")  # fmt: skip
        size = cfg.intermediate_size
        gate, up = b.op_multi("Split", [gate_up, b.const([size, size])], [f"{name}.gate", f"{name}.up"], axis=-1)
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{name}.sigmoid")], f"{name}.silu")
        activated = b.op("Mul", [silu, up], f"{name}.act")
        out = b.op("MatMul", [activated, self._weight(f"{name}.down_proj.weight", self.weights.down(layer))],
                   f"{name}.down")  # fmt: skip
        return b.op("Add", [x, self._to_float(out, f"{name}.down_f32")], f"model.layers.{layer}.mlp_residual")

    def _weight(self, name: str, array: np.ndarray) -> str:
        return self.b.weight(name, array, self.precision.numpy)


def build_decoder(builder: GraphBuilder, config: LlamaConfig, weights: LlamaWeights, precision: Precision) -> None:
    """Add the whole decoder to `builder`; its outputs carry the names `decoder_outputs` declares."""
    _Decoder(builder, config, weights, precision).build()
