"""A plain numpy BERT (float64, one unpadded sequence at a time) and a tiny safetensors checkpoint writer.

Written from the math, independently of `sie.worker.convert`, so converted graphs can be checked
against it; shared by the converter tests and the cross-encoder adapter test.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

HIDDEN, NUM_HEADS, LAYERS, INTERMEDIATE = 32, 4, 2, 64
VOCAB, MAX_POSITIONS, TYPE_VOCAB, LABELS = 60, 24, 2, 3
EPS = 1e-12
TOLERANCE = 1e-4
# Three sequences of different lengths; padding ids are random on purpose: only the mask may hide them.
SEQUENCES = (
    ([2, 17, 33, 5, 41, 9, 3], [0, 0, 0, 0, 1, 1, 1]),
    ([2, 8, 3], [0, 0, 0]),
    ([2, 50, 12, 29, 3], [0, 0, 1, 1, 1]),
)


# --- the checkpoint: random weights written as a safetensors file --------------------------------


def encode_tensor(array: np.ndarray, dtype: str) -> bytes:
    if dtype == "F32":
        return array.astype("<f4").tobytes()
    if dtype == "F16":
        return array.astype("<f2").tobytes()
    if dtype == "BF16":  # the top 16 bits of each float32 (truncation)
        return (array.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    if dtype == "I64":
        return array.astype("<i8").tobytes()
    raise ValueError(dtype)


def stored_values(array: np.ndarray, dtype: str) -> np.ndarray:
    """What a reader gets back from `encode_tensor`, as float64 for the reference."""
    if dtype == "F16":
        return array.astype(np.float16).astype(np.float64)
    if dtype == "BF16":
        return ((array.astype(np.float32).view(np.uint32) >> 16) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64)


def write_safetensors(path: Path, tensors: dict[str, tuple[np.ndarray, str]]) -> None:
    """8-byte little-endian header length, JSON header, then the raw buffers back to back."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    buffers, offset = [], 0
    for name, (array, dtype) in tensors.items():
        raw = encode_tensor(array, dtype)
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        buffers.append(raw)
        offset += len(raw)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(buffers))


def random_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Canonical (BertModel / BertFor* task) names with torch layouts: Linear weights are [out, in]."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": 1.0 + normal(HIDDEN, scale=0.1), f"{prefix}.bias": normal(HIDDEN, scale=0.1)}

    def dense(prefix: str, out_features: int, in_features: int) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": normal(out_features, in_features), f"{prefix}.bias": normal(out_features)}

    weights = {
        "embeddings.word_embeddings.weight": normal(VOCAB, HIDDEN, scale=0.5),
        "embeddings.position_embeddings.weight": normal(MAX_POSITIONS, HIDDEN, scale=0.5),
        "embeddings.token_type_embeddings.weight": normal(TYPE_VOCAB, HIDDEN, scale=0.5),
        **norm("embeddings.LayerNorm"),
        **dense("pooler.dense", HIDDEN, HIDDEN),
    }
    for index in range(LAYERS):
        layer = f"encoder.layer.{index}"
        for part in ("query", "key", "value"):
            weights |= dense(f"{layer}.attention.self.{part}", HIDDEN, HIDDEN)
        weights |= dense(f"{layer}.attention.output.dense", HIDDEN, HIDDEN) | norm(
            f"{layer}.attention.output.LayerNorm"
        )
        weights |= dense(f"{layer}.intermediate.dense", INTERMEDIATE, HIDDEN)
        weights |= dense(f"{layer}.output.dense", HIDDEN, INTERMEDIATE) | norm(f"{layer}.output.LayerNorm")
    return weights


def head_weights(seed: int = 1) -> dict[str, np.ndarray]:
    """Task-head tensors, stored without the `bert.` prefix as transformers does."""
    rng = np.random.default_rng(seed)
    return {
        "classifier.weight": (rng.standard_normal((LABELS, HIDDEN)) * 0.3).astype(np.float32),
        "classifier.bias": (rng.standard_normal(LABELS) * 0.1).astype(np.float32),
        "cls.predictions.transform.dense.weight": (rng.standard_normal((HIDDEN, HIDDEN)) * 0.2).astype(np.float32),
        "cls.predictions.transform.dense.bias": (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "cls.predictions.transform.LayerNorm.weight": (1 + rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "cls.predictions.transform.LayerNorm.bias": (rng.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "cls.predictions.bias": (rng.standard_normal(VOCAB) * 0.5 + 0.5).astype(np.float32),
    }


def write_checkpoint(
    directory: Path, dtype: str, prefix: str = "", legacy_norm_names: bool = False, untied: bool = False
) -> dict:
    """Write config.json + model.safetensors; return the float64 values a correct reader must see.

    The MLM decoder is stored explicitly, as some exports do: tied (equal to the word embeddings,
    which the converter must not store twice) or, with `untied`, a different matrix.
    """
    base, heads = random_weights(), head_weights()
    decoder = base["embeddings.word_embeddings.weight"]
    heads["cls.predictions.decoder.weight"] = (decoder * 0.5 + 0.1) if untied else decoder
    tensors: dict[str, tuple[np.ndarray, str]] = {
        f"{prefix}embeddings.position_ids": (np.arange(MAX_POSITIONS, dtype=np.int64)[None], "I64")
    }
    for name, array in (base | heads).items():
        stored = name if name in heads else prefix + name
        if legacy_norm_names:
            stored = stored.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        tensors[stored] = (array, dtype)
    write_safetensors(directory / "model.safetensors", tensors)
    config = {
        "model_type": "bert", "architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": HIDDEN,
        "num_attention_heads": NUM_HEADS, "num_hidden_layers": LAYERS, "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS, "type_vocab_size": TYPE_VOCAB, "vocab_size": VOCAB,
        "layer_norm_eps": EPS, "id2label": {str(i): f"LABEL_{i}" for i in range(LABELS)},
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    return {name: stored_values(array, dtype) for name, array in (base | heads).items()}


# --- the reference: BERT from the math, one unpadded sequence at a time, in float64 ----------------


def layer_norm(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + EPS) * w[f"{name}.weight"] + w[f"{name}.bias"]


def dense(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def self_attention(x: np.ndarray, w: dict, layer: str) -> np.ndarray:
    length, head_size = x.shape[0], HIDDEN // NUM_HEADS

    def split(part: str) -> np.ndarray:  # [heads, S, head_size]
        return dense(x, w, f"{layer}.attention.self.{part}").reshape(length, NUM_HEADS, head_size).transpose(1, 0, 2)

    q, k, v = split("query"), split("key"), split("value")
    probs = softmax(q @ k.transpose(0, 2, 1) / math.sqrt(head_size))
    return (probs @ v).transpose(1, 0, 2).reshape(length, HIDDEN)


def reference_hidden(w: dict, ids: list[int], types: list[int]) -> np.ndarray:
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][: len(ids)]
        + w["embeddings.token_type_embeddings.weight"][types]
    )
    x = layer_norm(x, w, "embeddings.LayerNorm")
    for index in range(LAYERS):
        layer = f"encoder.layer.{index}"
        attended = dense(self_attention(x, w, layer), w, f"{layer}.attention.output.dense")
        x = layer_norm(attended + x, w, f"{layer}.attention.output.LayerNorm")
        inner = gelu(dense(x, w, f"{layer}.intermediate.dense"))
        x = layer_norm(dense(inner, w, f"{layer}.output.dense") + x, w, f"{layer}.output.LayerNorm")
    return x


def l2_normalize(v: np.ndarray) -> np.ndarray:
    return v / max(np.linalg.norm(v), 1e-12)


def reference_outputs(head: str, w: dict, ids: list[int], types: list[int]) -> dict[str, np.ndarray]:
    hidden = reference_hidden(w, ids, types)
    if head == "none":
        return {"last_hidden_state": hidden}
    if head in ("mean", "cls"):
        pooled = hidden.mean(0) if head == "mean" else hidden[0]
        return {"last_hidden_state": hidden, "sentence_embedding": l2_normalize(pooled)}
    if head in ("seq-cls", "seq-cls-states"):
        pooled = np.tanh(dense(hidden[0], w, "pooler.dense"))
        logits = {"logits": dense(pooled, w, "classifier")}
        return logits if head == "seq-cls" else {"last_hidden_state": hidden, **logits}
    if head == "token-cls":
        return {"logits": dense(hidden, w, "classifier")}
    transformed = layer_norm(
        gelu(dense(hidden, w, "cls.predictions.transform.dense")), w, "cls.predictions.transform.LayerNorm"
    )
    logits = transformed @ w["cls.predictions.decoder.weight"].T + w["cls.predictions.bias"]
    weights = np.log1p(np.maximum(logits, 0.0))
    if head == "mlm-splade":
        return {"sparse_embedding": weights.max(0)}
    if head == "mlm-splade-sum-log1p":
        weights = np.log1p(weights)
    return {"sparse_embedding": weights.sum(0)}
