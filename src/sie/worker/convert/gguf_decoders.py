"""The GGUF source of the decoder graph, for the llama.cpp architectures `llama`, `qwen2`, `qwen3` and `gemma3`:
`gguf_config` reads the architecture numbers from a GGUF file's `{architecture}.*` metadata (checked for what the
graph cannot handle) into a `DecoderConfig`, filling in what llama.cpp hard-codes for the architecture instead of
storing it (and Llama 3.1's RoPE scaling from its `rope_freqs` factors), and `gguf_weights` serves its tensors under
transformers' names (dequantized to float32; llama.cpp's q/k row permutation undone for `llama`, which alone is
stored permuted; Gemma's norms back from the 1 + weight llama.cpp stores), so `decoder_graph` builds the same
decoder from a GGUF file as from a safetensors checkpoint.
"""

from __future__ import annotations

import re
from typing import Any, Final

import numpy as np

from sie.worker.convert.decoder_graph import DecoderConfig, DecoderWeights
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import MODEL_TYPES, GgufFile

SUPPORTED_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "gemma3"})
DEFAULT_ROPE_BASE = 10_000.0
DEFAULT_RMS_EPS = 1e-5
ROPE_FREQS: Final = "rope_freqs.weight"
# What llama.cpp's model loader sets for `gemma3` rather than reads: with a sliding window, every sixth layer
# attends globally and the others within the window, rotating with their own RoPE base, unscaled.
GEMMA3_GLOBAL_EVERY: Final = 6
GEMMA3_LOCAL_ROPE_BASE: Final = 10_000.0
# Gemma 3 27B (62 layers) scales its queries by hidden / heads, not head_dim (its query_pre_attn_scalar).
GEMMA3_27B_LAYERS: Final = 62
# Tensors of a multimodal GGUF's vision tower and projector: llama.cpp keeps them in a separate mmproj file.
_VISION_PREFIXES: Final = ("v.", "mm.")


def gguf_config(gguf: GgufFile) -> DecoderConfig:
    """Read and check the `{architecture}.*` metadata of `gguf`; errors name the file and the key."""
    arch = gguf.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"architecture {arch!r} is not supported; expected one of {sorted(SUPPORTED_ARCHITECTURES)}",
            source=str(gguf.path),
        )
    numbers = _numbers(gguf, arch)
    options = _gemma3(gguf, numbers) if arch == "gemma3" else {"qk_norm": arch == "qwen3"}
    config = DecoderConfig(**(numbers | options))
    config.check(str(gguf.path))
    rope_dims = gguf.value(f"{arch}.rope.dimension_count", config.head_dim)
    if rope_dims != config.head_dim:
        raise ConversionError(
            f"partial RoPE ({rope_dims} of {config.head_dim} dims) is not supported", source=str(gguf.path)
        )
    return config


def _numbers(gguf: GgufFile, arch: str) -> dict[str, Any]:
    """The DecoderConfig fields every architecture stores the same way."""
    embeddings = gguf.shape("token_embd.weight")
    hidden = _positive(gguf, f"{arch}.embedding_length")
    heads = _positive(gguf, f"{arch}.attention.head_count")
    if gguf.value(f"{arch}.attention.key_length", None) is not None:
        head_dim = _positive(gguf, f"{arch}.attention.key_length")
    elif hidden % heads:
        raise ConversionError(f"hidden size {hidden} does not split into {heads} heads", source=str(gguf.path))
    else:
        head_dim = hidden // heads
    value_dim = gguf.value(f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ConversionError(f"value heads of {value_dim} differ from key heads of {head_dim}", source=str(gguf.path))
    return {
        "model_type": MODEL_TYPES.get(arch, arch),
        "hidden_size": hidden,
        "intermediate_size": _positive(gguf, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _positive(gguf, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _positive(gguf, f"{arch}.attention.head_count_kv"),
        "head_dim": head_dim,
        "vocab_size": int(gguf.value(f"{arch}.vocab_size", embeddings[0])),
        "max_position_embeddings": _positive(gguf, f"{arch}.context_length"),
        "rope_theta": float(gguf.value(f"{arch}.rope.freq_base", DEFAULT_ROPE_BASE)),
        "rope_scaling": _rope_scaling(gguf, arch),
        "rope_frequency_factors": _rope_frequency_factors(gguf),
        "rms_norm_eps": float(gguf.value(f"{arch}.attention.layer_norm_rms_epsilon", DEFAULT_RMS_EPS)),
        "tie_word_embeddings": "output.weight" not in gguf,
        "qkv_bias": "blk.0.attn_q.bias" in gguf,
        "output_bias": "blk.0.attn_output.bias" in gguf,
    }


def _rope_frequency_factors(gguf: GgufFile) -> tuple[float, ...]:
    """The `rope_freqs` tensor, where the file has one: llama.cpp divides each pair's inverse frequency by its factor
    (its converter writes Llama 3.1's `llama3` RoPE scaling so)."""
    if ROPE_FREQS not in gguf:
        return ()
    return tuple(np.asarray(gguf.load(ROPE_FREQS), dtype=np.float64).reshape(-1).tolist())


def _rope_scaling(gguf: GgufFile, arch: str) -> dict[str, Any]:
    """transformers' rope_scaling for llama.cpp's `rope.scaling.*`: none, or linear (positions divided by the
    factor; llama.cpp's freq_scale is its inverse). Gemma 3 applies it to its global layers only, as the graph's
    local RoPE table (the sliding layers') is unscaled."""
    kind = gguf.value(f"{arch}.rope.scaling.type", "none")
    if kind in ("none", None):
        return {}
    if kind != "linear":
        raise ConversionError(f"RoPE scaling {kind!r} is not supported; expected 'none' or 'linear'",
                              source=str(gguf.path))  # fmt: skip
    factor = gguf.value(f"{arch}.rope.scaling.factor")
    if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0:
        raise ConversionError(f"RoPE scaling factor must be a positive number, got {factor!r}", source=str(gguf.path))
    return {} if factor == 1 else {"rope_type": "linear", "factor": float(factor)}


def _gemma3(gguf: GgufFile, numbers: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's options as llama.cpp runs a `gemma3` file: the numbers it hard-codes (the sliding layers, their
    RoPE base, the query scale), tanh-GELU, sandwich norms of 1 + weight, embeddings times sqrt(hidden), and the
    final logit soft cap only where the file names one (llama.cpp's default for gemma3 is none)."""
    vision = [tensor for tensor in gguf.tensor_names if tensor.startswith(_VISION_PREFIXES)]
    if vision:
        raise ConversionError(f"vision tensors ({vision[0]}, ...) are not served; only the text decoder is",
                              source=str(gguf.path))  # fmt: skip
    layers, hidden = numbers["num_hidden_layers"], numbers["hidden_size"]
    window = gguf.value("gemma3.attention.sliding_window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ConversionError(f"metadata key 'gemma3.attention.sliding_window' must be a non-negative integer, "
                              f"got {window!r}", source=str(gguf.path))  # fmt: skip
    windows = tuple(None if index % GEMMA3_GLOBAL_EVERY == GEMMA3_GLOBAL_EVERY - 1 else window
                    for index in range(layers)) if window else ()  # fmt: skip
    query_scalar = hidden // numbers["num_attention_heads"] if layers == GEMMA3_27B_LAYERS else numbers["head_dim"]
    softcap = gguf.value("gemma3.final_logit_softcapping", None)
    return {
        "rms_norm_eps": float(gguf.value("gemma3.attention.layer_norm_rms_epsilon")),
        "qk_norm": True,
        "layer_windows": windows,
        "norm_offset": 1.0,
        "embedding_multiplier": float(np.float32(hidden**0.5)),
        "attention_scale": float(query_scalar) ** -0.5,
        "sandwich_norms": True,
        "activation": "gelu_tanh",
        "local_rope_theta": GEMMA3_LOCAL_ROPE_BASE if windows else None,
        "final_logit_softcap": float(softcap) if softcap else None,
    }


def _positive(gguf: GgufFile, key: str) -> int:
    value = gguf.value(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConversionError(f"metadata key {key!r} must be a positive integer, got {value!r}", source=str(gguf.path))
    return value


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(weights, n_head)`: row `h*d + 2j + c` goes back to `h*d + c*d/2 + j`."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# transformers' tensor names (the decoder graph's) -> llama.cpp's (gguf.constants.TENSOR_NAMES)
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
# Gemma's sandwich: llama.cpp's `ffn_norm` is the norm before the MLP, which Gemma calls pre_feedforward_layernorm;
# the norm after attention (post_attention_layernorm, Llama's pre-MLP norm) has a name of its own.
_GEMMA3_LAYER_NAMES = _GGUF_LAYER_NAMES | {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(name: str, architecture: str = "llama") -> str:
    """llama.cpp's name for a transformers decoder tensor name in `architecture` (unchanged when it has none)."""
    if name in _GGUF_NAMES:
        return _GGUF_NAMES[name]
    layer_names = _GEMMA3_LAYER_NAMES if architecture == "gemma3" else _GGUF_LAYER_NAMES
    match = _LAYER_NAME.fullmatch(name)
    if match and match.group(2) in layer_names:
        return f"blk.{match.group(1)}.{layer_names[match.group(2)]}"
    return name


def gguf_weights(gguf: GgufFile, config: DecoderConfig) -> DecoderWeights:
    """The GGUF file's tensors under transformers' names, a llama file's q and k rows back in transformers' order
    (llama.cpp permutes them for its adjacent-pair rotation; the qwen and gemma architectures it rotates by halves,
    as transformers does, and stores unpermuted), a gemma file's norms less the 1 llama.cpp's converter added (the
    graph adds it back, as for a checkpoint)."""
    arch = gguf.architecture
    permuted = arch == "llama"
    norm_shift = np.float32(config.norm_offset)

    def load(name: str) -> np.ndarray:
        array = gguf.load(gguf_name(name, arch))
        if permuted and name.endswith("self_attn.q_proj.weight"):
            return unpermute_rows(array, config.num_attention_heads)
        if permuted and name.endswith("self_attn.k_proj.weight"):
            return unpermute_rows(array, config.num_key_value_heads)
        if norm_shift and name.endswith("norm.weight"):
            return array - norm_shift
        return array

    return DecoderWeights(config, load, lambda name: gguf_name(name, arch) in gguf, str(gguf.path))
