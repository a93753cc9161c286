"""`LlamaWeights`: the parameters of a llama decoder read from GGUF tensors (llama.cpp names), dequantized to
float32 and laid out as the graph multiplies them (`[in, out]`), with llama.cpp's q/k row permutation undone.

llama.cpp's converter interleaves each head's query/key rows so that its RoPE rotates adjacent pairs; undoing it
here gives back the Hugging Face "rotate half" layout the graph's RoPE uses. It never builds graph nodes.
"""

from __future__ import annotations

import math

import numpy as np

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import GgufFile
from sie.worker.convert.llama_config import LlamaConfig


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
