"""The llama GGUF source of the decoder graph: `llama_config` reads the architecture numbers from a GGUF file's
`llama.*` metadata (checked for what the graph cannot handle) into a `DecoderConfig`, and `gguf_weights` serves its
tensors under transformers' names (dequantized to float32, llama.cpp's q/k row permutation undone), so
`decoder_graph` builds the same decoder from a GGUF file as from a safetensors checkpoint.
"""

from __future__ import annotations

import re

import numpy as np

from sie.worker.convert.decoder_graph import DecoderConfig, DecoderWeights
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import GgufFile

SUPPORTED_ARCHITECTURES = frozenset({"llama"})
DEFAULT_ROPE_BASE = 10_000.0
DEFAULT_RMS_EPS = 1e-5


def llama_config(gguf: GgufFile) -> DecoderConfig:
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
    hidden = _positive(gguf, "llama.embedding_length")
    heads = _positive(gguf, "llama.attention.head_count")
    if hidden % heads:
        raise ConversionError(f"hidden size {hidden} does not split into {heads} heads", source=str(gguf.path))
    config = DecoderConfig(
        model_type="llama",
        hidden_size=hidden,
        intermediate_size=_positive(gguf, "llama.feed_forward_length"),
        num_hidden_layers=_positive(gguf, "llama.block_count"),
        num_attention_heads=heads,
        num_key_value_heads=_positive(gguf, "llama.attention.head_count_kv"),
        head_dim=hidden // heads,
        vocab_size=int(gguf.value("llama.vocab_size", embeddings[0])),
        max_position_embeddings=_positive(gguf, "llama.context_length"),
        rope_theta=float(gguf.value("llama.rope.freq_base", DEFAULT_ROPE_BASE)),
        rms_norm_eps=float(gguf.value("llama.attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS)),
        tie_word_embeddings="output.weight" not in gguf,
    )
    config.check(str(gguf.path))
    rope_dims = gguf.value("llama.rope.dimension_count", config.head_dim)
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
    """llama.cpp's name for a transformers llama tensor name (unchanged when it has none)."""
    if name in _GGUF_NAMES:
        return _GGUF_NAMES[name]
    match = _LAYER_NAME.fullmatch(name)
    if match and match.group(2) in _GGUF_LAYER_NAMES:
        return f"blk.{match.group(1)}.{_GGUF_LAYER_NAMES[match.group(2)]}"
    return name


def gguf_weights(gguf: GgufFile, config: DecoderConfig) -> DecoderWeights:
    """The GGUF file's tensors under transformers' names, q and k rows back in transformers' order."""

    def load(name: str) -> np.ndarray:
        array = gguf.load(gguf_name(name))
        if name.endswith("self_attn.q_proj.weight"):
            return unpermute_rows(array, config.num_attention_heads)
        if name.endswith("self_attn.k_proj.weight"):
            return unpermute_rows(array, config.num_key_value_heads)
        return array

    return DecoderWeights(config, load, lambda name: gguf_name(name) in gguf, str(gguf.path))
