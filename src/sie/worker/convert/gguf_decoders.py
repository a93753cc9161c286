"""The GGUF source of the decoder graph, for the llama.cpp architectures `llama`, `qwen2` and `qwen3`:
`gguf_config` reads the architecture numbers from a GGUF file's `{architecture}.*` metadata (checked for what the
graph cannot handle) into a `DecoderConfig`, and `gguf_weights` serves its tensors under transformers' names
(dequantized to float32; llama.cpp's q/k row permutation undone for `llama`, which alone is stored permuted), so
`decoder_graph` builds the same decoder from a GGUF file as from a safetensors checkpoint.
"""

from __future__ import annotations

import re

import numpy as np

from sie.worker.convert.decoder_graph import DecoderConfig, DecoderWeights
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import GgufFile

SUPPORTED_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
DEFAULT_ROPE_BASE = 10_000.0
DEFAULT_RMS_EPS = 1e-5


def gguf_config(gguf: GgufFile) -> DecoderConfig:
    """Read and check the `{architecture}.*` metadata of `gguf`; errors name the file and the key."""
    arch = gguf.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"architecture {arch!r} is not supported; expected one of {sorted(SUPPORTED_ARCHITECTURES)}",
            source=str(gguf.path),
        )
    if gguf.value(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ConversionError("RoPE scaling is not supported", source=str(gguf.path))
    embeddings = gguf.shape("token_embd.weight")
    hidden = _positive(gguf, f"{arch}.embedding_length")
    heads = _positive(gguf, f"{arch}.attention.head_count")
    head_dim = gguf.value(f"{arch}.attention.key_length", None)
    if head_dim is None:
        if hidden % heads:
            raise ConversionError(f"hidden size {hidden} does not split into {heads} heads", source=str(gguf.path))
        head_dim = hidden // heads
    else:
        head_dim = _positive(gguf, f"{arch}.attention.key_length")
    config = DecoderConfig(
        model_type=arch,
        hidden_size=hidden,
        intermediate_size=_positive(gguf, f"{arch}.feed_forward_length"),
        num_hidden_layers=_positive(gguf, f"{arch}.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_positive(gguf, f"{arch}.attention.head_count_kv"),
        head_dim=head_dim,
        vocab_size=int(gguf.value(f"{arch}.vocab_size", embeddings[0])),
        max_position_embeddings=_positive(gguf, f"{arch}.context_length"),
        rope_theta=float(gguf.value(f"{arch}.rope.freq_base", DEFAULT_ROPE_BASE)),
        rms_norm_eps=float(gguf.value(f"{arch}.attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS)),
        tie_word_embeddings="output.weight" not in gguf,
        qkv_bias="blk.0.attn_q.bias" in gguf,
        output_bias="blk.0.attn_output.bias" in gguf,
        qk_norm=arch == "qwen3",
    )
    config.check(str(gguf.path))
    rope_dims = gguf.value(f"{arch}.rope.dimension_count", config.head_dim)
    if rope_dims != config.head_dim:
        raise ConversionError(
            f"partial RoPE ({rope_dims} of {config.head_dim} dims) is not supported", source=str(gguf.path)
        )
    return config


def _positive(gguf: GgufFile, key: str) -> int:
    value = gguf.value(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConversionError(f"metadata key {key!r} must be a positive integer, got {value!r}", source=str(gguf.path))
    return value


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(weights, n_head)`: row `h*d + 2j + c` goes back to `h*d + c*d/2 + j`."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# transformers' tensor names (the decoder graph's) -> llama.cpp's
_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
    "model.norm.weight": "output_norm.weight",
}
_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(name: str) -> str:
    """llama.cpp's name for a transformers decoder tensor name (unchanged when it has none)."""
    if name in _GGUF_NAMES:
        return _GGUF_NAMES[name]
    match = _LAYER_NAME.fullmatch(name)
    if match and match.group(2) in _GGUF_LAYER_NAMES:
        return f"blk.{match.group(1)}.{_GGUF_LAYER_NAMES[match.group(2)]}"
    return name


def gguf_weights(gguf: GgufFile, config: DecoderConfig) -> DecoderWeights:
    """The GGUF file's tensors under transformers' names, a llama file's q and k rows back in transformers' order
    (llama.cpp permutes them for its adjacent-pair rotation; the qwen architectures it rotates by halves, as
    transformers does, and stores unpermuted)."""
    permuted = config.model_type == "llama"

    def load(name: str) -> np.ndarray:
        array = gguf.load(gguf_name(name))
        if permuted and name.endswith("self_attn.q_proj.weight"):
            return unpermute_rows(array, config.num_attention_heads)
        if permuted and name.endswith("self_attn.k_proj.weight"):
            return unpermute_rows(array, config.num_key_value_heads)
        return array

    return DecoderWeights(config, load, lambda name: gguf_name(name) in gguf, str(gguf.path))
