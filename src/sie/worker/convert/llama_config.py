"""`LlamaConfig`: the architecture numbers of a llama-family decoder, read from GGUF metadata (`llama.*` keys),
and the Hugging Face style `config.json` the causal-LM adapter reads next to the converted graph.

It validates what the graph builder cannot handle (other architectures, RoPE scaling, untied heads of
another shape) and never reads weights.
"""

from __future__ import annotations

from typing import Any

import attrs

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import GgufFile

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
