"""A tiny llama decoder for converter tests: random weights written as a GGUF file the way llama.cpp's converter
writes them (q/k rows permuted for adjacent-pair RoPE, a byte-level BPE vocabulary in the metadata), and a plain
numpy forward pass in the Hugging Face layout (rotate-half RoPE, repeated key/value heads) to compare against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, LAYERS, CONTEXT = 32, 4, 2, 48, 2, 64
HEAD_DIM = HIDDEN // HEADS
ROPE_BASE, RMS_EPS = 10_000.0, 1e-5
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "i n", "Ġ a")
CHAT_TEMPLATE = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% endfor %}"


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 one-character tokens of every byte-level BPE vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return [chr(code) for _, code in sorted(zip(printable, codes, strict=True))]


def vocabulary() -> list[str]:
    merged = ["".join(merge.split(" ")) for merge in MERGES]
    return [*SPECIALS, *byte_level_alphabet(), *merged]


VOCAB = len(vocabulary())


@attrs.frozen
class Layer:
    """One block in Hugging Face layout: projections are `[out, in]`."""

    attn_norm: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    ffn_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


@attrs.frozen
class TinyLlama:
    embeddings: np.ndarray
    layers: tuple[Layer, ...]
    final_norm: np.ndarray


def random_llama(seed: int = 3) -> TinyLlama:
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)

    layers = tuple(
        Layer(
            attn_norm=norm(),
            q=matrix(HEADS * HEAD_DIM, HIDDEN),
            k=matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            v=matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            o=matrix(HIDDEN, HEADS * HEAD_DIM),
            ffn_norm=norm(),
            gate=matrix(INTERMEDIATE, HIDDEN),
            up=matrix(INTERMEDIATE, HIDDEN),
            down=matrix(HIDDEN, INTERMEDIATE),
        )
        for _ in range(LAYERS)
    )
    embeddings = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    return TinyLlama(embeddings, layers, norm())


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows: each head's two halves interleaved pairwise."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def add_decoder_numbers(writer: gguf.GGUFWriter, config: Any) -> None:
    """A transformers decoder config's shape as llama.cpp's converter writes it under `{architecture}.*` (the RoPE
    base is the caller's: Gemma 3 keeps one per layer type)."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)


def write_gguf(
    model: TinyLlama, path: Path, architecture: str = "llama", pre: str = "smollm", eot: int | None = None
) -> Path:
    """`model` as llama.cpp writes it (`eot`: a `tokenizer.ggml.eot_token_id` to name)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    if eot is not None:
        writer.add_eot_token_id(eot)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    tokens = vocabulary()
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in SPECIALS else 1 for token in tokens])
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", model.embeddings)
    for index, layer in enumerate(model.layers):
        prefix = f"blk.{index}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", layer.attn_norm)
        writer.add_tensor(f"{prefix}.attn_q.weight", llama_cpp_permute(layer.q, HEADS))
        writer.add_tensor(f"{prefix}.attn_k.weight", llama_cpp_permute(layer.k, KV_HEADS))
        writer.add_tensor(f"{prefix}.attn_v.weight", layer.v)
        writer.add_tensor(f"{prefix}.attn_output.weight", layer.o)
        writer.add_tensor(f"{prefix}.ffn_norm.weight", layer.ffn_norm)
        writer.add_tensor(f"{prefix}.ffn_gate.weight", layer.gate)
        writer.add_tensor(f"{prefix}.ffn_up.weight", layer.up)
        writer.add_tensor(f"{prefix}.ffn_down.weight", layer.down)
    writer.add_tensor("output_norm.weight", model.final_norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --- the numpy reference ------------------------------------------------------------------------------


def _rms(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS) * scale


def _rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Hugging Face rotate-half RoPE on `[B, heads, S, d]` at `[B, S]` positions."""
    inverse = 1.0 / ROPE_BASE ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    angles = positions[..., None] * inverse
    angles = np.concatenate([angles, angles], axis=-1)[:, None]
    first, second = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return x * np.cos(angles) + np.concatenate([-second, first], axis=-1) * np.sin(angles)


def _heads(x: np.ndarray, count: int) -> np.ndarray:
    batch, length, _ = x.shape
    return x.reshape(batch, length, count, HEAD_DIM).transpose(0, 2, 1, 3)


def reference_logits(model: TinyLlama, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """float64 logits `[B, S, vocab]` of a whole (left-padded) sequence, as Hugging Face's LlamaForCausalLM."""
    batch, length = input_ids.shape
    positions = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0).astype(np.float64)
    visible = np.tril(np.ones((length, length), dtype=bool))[None] & attention_mask[:, None, :].astype(bool)
    x = model.embeddings[input_ids].astype(np.float64)
    for layer in model.layers:
        h = _rms(x, layer.attn_norm)
        q = _rope(_heads(h @ layer.q.T, HEADS), positions)
        k = np.repeat(_rope(_heads(h @ layer.k.T, KV_HEADS), positions), HEADS // KV_HEADS, axis=1)
        v = np.repeat(_heads(h @ layer.v.T, KV_HEADS), HEADS // KV_HEADS, axis=1)
        scores = np.where(visible[:, None], q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM), -1e30)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, HIDDEN) @ layer.o.T
        h = _rms(x, layer.ffn_norm)
        gate = h @ layer.gate.T
        x = x + (gate / (1.0 + np.exp(-gate)) * (h @ layer.up.T)) @ layer.down.T
    return _rms(x, model.final_norm) @ model.embeddings.T


def tiny_decoder_session(directory: Path) -> tuple[Any, Any]:
    """`random_llama` converted to the decoder graph in `directory`, in an onnxruntime session on one CPU thread, with
    its CacheShape."""
    import json

    import onnxruntime as ort

    from sie.worker.convert import CONFIG_FILE, convert_gguf
    from sie.worker.generation.kv_cache import CacheShape

    converted = convert_gguf(write_gguf(random_llama(), directory / "tiny.gguf"), directory / "decoder")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(converted.graph), options, providers=["CPUExecutionProvider"])
    return session, CacheShape.from_config(json.loads((converted.directory / CONFIG_FILE).read_text()))
