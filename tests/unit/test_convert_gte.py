"""The GTE "new" family (`model_type: "new"`, remote code `Alibaba-NLP/new-impl`) against a numpy reference.

transformers has no class for this architecture, so the reference below is a float64 transcription, one unpadded
sequence at a time, of the math of `modeling.py` in `Alibaba-NLP/new-impl` (NewEmbeddings, RotaryEmbedding and
NTKScalingRotaryEmbedding, NewAttention, NewGatedMLP, NewLayer, NewPooler, NewLMPredictionHead), written
independently of `sie.worker.convert`. Tiny random checkpoints carry the real tensor names and a config.json shaped
like the Hub's; each is converted, run by onnxruntime on a right-padded batch and compared at the real tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from safetensors.numpy import save_file

from sie.worker.convert import ConversionError, convert_encoder

HIDDEN, HEADS, LAYERS, INTERMEDIATE, VOCAB, LABELS = 32, 4, 2, 48, 60, 3
HEAD_SIZE = HIDDEN // HEADS
EPS = 1e-12
TOLERANCE = 1e-4
LENGTHS = (9, 4, 6)  # right-padded to 9; padding ids are random: only the mask may hide them


# --- the checkpoint ---------------------------------------------------------------------------------------------------


def hub_config(types: int, theta: float, scaling: dict[str, Any] | None) -> dict[str, Any]:
    """A config.json as gte-base-en-v1.5's and gte-multilingual-base's, shrunk."""
    return {
        "architectures": ["NewModel"],
        "attention_probs_dropout_prob": 0.0,
        "auto_map": {
            "AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
            "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
            "AutoModelForMaskedLM": "Alibaba-NLP/new-impl--modeling.NewForMaskedLM",
            "AutoModelForSequenceClassification": "Alibaba-NLP/new-impl--modeling.NewForSequenceClassification",
        },
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "id2label": {str(index): f"LABEL_{index}" for index in range(LABELS)},
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "layer_norm_eps": EPS,
        "layer_norm_type": "layer_norm",
        "logn_attention_clip1": False,
        "logn_attention_scale": False,
        "max_position_embeddings": 64,
        "model_type": "new",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "pack_qkv": True,
        "pad_token_id": 0,
        "position_embedding_type": "rope",
        "rope_scaling": scaling,
        "rope_theta": theta,
        "torch_dtype": "float32",
        "transformers_version": "4.39.1",
        "type_vocab_size": types,
        "unpad_inputs": False,
        "use_memory_efficient_attention": False,
        "vocab_size": VOCAB,
    }


def random_weights(types: int, seed: int = 0) -> dict[str, np.ndarray]:
    """NewModel's tensors (torch layout: Linear weights [out, in]) and the task heads' (`new.pooler` is NewModel's)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1.0 + normal(HIDDEN, scale=0.1), f"{name}.bias": normal(HIDDEN, scale=0.1)}

    def dense(name: str, out_features: int, in_features: int) -> dict[str, np.ndarray]:
        return {f"{name}.weight": normal(out_features, in_features), f"{name}.bias": normal(out_features)}

    weights = {"embeddings.word_embeddings.weight": normal(VOCAB, HIDDEN, scale=0.5), **norm("embeddings.LayerNorm")}
    if types:
        weights["embeddings.token_type_embeddings.weight"] = normal(types, HIDDEN, scale=0.5)
    for index in range(LAYERS):
        layer = f"encoder.layer.{index}"
        weights |= dense(f"{layer}.attention.qkv_proj", 3 * HIDDEN, HIDDEN) | dense(
            f"{layer}.attention.o_proj", HIDDEN, HIDDEN
        )
        weights[f"{layer}.mlp.up_gate_proj.weight"] = normal(2 * INTERMEDIATE, HIDDEN)
        weights |= dense(f"{layer}.mlp.down_proj", HIDDEN, INTERMEDIATE)
        weights |= norm(f"{layer}.attn_ln") | norm(f"{layer}.mlp_ln")
    weights |= dense("pooler.dense", HIDDEN, HIDDEN)
    heads = dense("classifier", LABELS, HIDDEN) | dense("lm_head.dense", HIDDEN, HIDDEN) | norm("lm_head.norm")
    heads |= dense("lm_head.decoder", VOCAB, HIDDEN)  # untied: the graph must read this matrix, not the embeddings
    return weights | {f"head:{name}": array for name, array in heads.items()}


def write_checkpoint(directory: Path, config: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """config.json + model.safetensors (encoder names under `prefix`, head names bare, as NewFor* save them); returns
    the float64 tensors under their unprefixed names."""
    directory.mkdir()
    weights = random_weights(config["type_vocab_size"])
    stored = {
        name.removeprefix("head:") if name.startswith("head:") else prefix + name: array
        for name, array in weights.items()
    }
    save_file(stored, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return {name.removeprefix("head:"): array.astype(np.float64) for name, array in weights.items()}


# --- the reference: modeling.py's math, one unpadded sequence at a time, in float64 -----------------------------------


def layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + EPS) * w[f"{name}.weight"] + w[f"{name}.bias"]


def dense(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def rotary(config: dict[str, Any], length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [S, 1, head_size]: RotaryEmbedding, or NTKScalingRotaryEmbedding (fixed NTK: base * factor, then the
    frequencies divided by factor ** (2 / dim)) when the cache it builds outgrows max_position_embeddings."""
    exponents = np.arange(0, HEAD_SIZE, 2) / HEAD_SIZE
    scaling = config["rope_scaling"]
    factor = scaling["factor"] if scaling else 1.0
    inverse = 1.0 / (config["rope_theta"] * (factor if factor > 1 else 1.0)) ** exponents
    if factor > 1:
        inverse = inverse / factor ** (2 / HEAD_SIZE)
    angles = np.arange(length)[:, None] * inverse[None, :]
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]
    return np.cos(angles), np.sin(angles)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def reference_hidden(
    config: dict[str, Any], w: dict[str, np.ndarray], ids: np.ndarray, types: np.ndarray
) -> np.ndarray:
    length = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids]
    if config["type_vocab_size"]:
        x = x + w["embeddings.token_type_embeddings.weight"][types]
    x = layer_norm(x, w, "embeddings.LayerNorm")
    cos, sin = rotary(config, length)
    for index in range(LAYERS):
        layer = f"encoder.layer.{index}"
        qkv = dense(x, w, f"{layer}.attention.qkv_proj")
        q, k, v = (part.reshape(length, HEADS, HEAD_SIZE) for part in np.split(qkv, 3, axis=-1))  # [S, heads, d]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        q, k, v = (t.transpose(1, 0, 2) for t in (q, k, v))  # [heads, S, d]
        probs = softmax(q @ k.transpose(0, 2, 1) / math.sqrt(HEAD_SIZE))
        context = (probs @ v).transpose(1, 0, 2).reshape(length, HIDDEN)
        x = layer_norm(x + dense(context, w, f"{layer}.attention.o_proj"), w, f"{layer}.attn_ln")
        up, gate = np.split(x @ w[f"{layer}.mlp.up_gate_proj.weight"].T, 2, axis=-1)
        x = layer_norm(x + dense(gelu(gate) * up, w, f"{layer}.mlp.down_proj"), w, f"{layer}.mlp_ln")
    return x


def reference(head: str, config: dict[str, Any], w: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> list:
    """One row per sequence of what the head outputs: per-token rows cut to the real tokens."""
    rows = []
    for row, length in enumerate(LENGTHS):
        hidden = reference_hidden(config, w, feeds["input_ids"][row, :length], feeds["token_type_ids"][row, :length])
        if head == "none":
            rows.append(hidden)
        elif head in ("mean", "cls"):
            pooled = hidden.mean(0) if head == "mean" else hidden[0]
            rows.append(pooled / np.linalg.norm(pooled))
        elif head == "seq-cls":  # NewForSequenceClassification: NewPooler (dense + tanh on the first token)
            rows.append(dense(np.tanh(dense(hidden[0], w, "pooler.dense")), w, "classifier"))
        elif head == "token-cls":
            rows.append(dense(hidden, w, "classifier"))
        else:  # SPLADE over NewForMaskedLM's logits
            transformed = layer_norm(gelu(dense(hidden, w, "lm_head.dense")), w, "lm_head.norm")
            rows.append(np.log1p(np.maximum(dense(transformed, w, "lm_head.decoder").max(0), 0.0)))
    return rows


# --- the comparison ---------------------------------------------------------------------------------------------------


def padded_batch(types: int, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (len(LENGTHS), max(LENGTHS))
    ids = rng.integers(1, VOCAB, size=shape)
    token_types = rng.integers(0, types, size=shape) if types > 1 else np.zeros(shape, dtype=np.int64)
    mask = np.zeros(shape, dtype=np.int64)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_types}


def max_difference(path: Path, head: str, config: dict[str, Any], w: dict[str, np.ndarray]) -> float:
    feeds = padded_batch(config["type_vocab_size"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ours = session.run(None, feeds)[-1]  # the head's own output comes last
    theirs = reference(head, config, w, feeds)
    per_token = head in ("none", "token-cls")
    return max(
        float(np.abs((ours[row, :length] if per_token else ours[row]) - expected).max())
        for row, (length, expected) in enumerate(zip(LENGTHS, theirs, strict=True))
    )


NTK = {"factor": 2.0, "type": "ntk"}
CHECKPOINTS = {  # token types, rope_theta, rope_scaling, the encoder's name prefix, config.json's model_type
    "en-v1.5": (0, 500_000.0, NTK, "", "new"),  # gte-base-en-v1.5: no token types, NTK scaling
    "multilingual": (1, 160_000.0, None, "", "new"),  # gte-multilingual-base: one token type
    "two-types-prefixed": (2, 10_000.0, NTK, "new.", "new"),  # saved from a NewFor* model: `new.` before the encoder
    # snowflake-arctic-embed-m-v2.0: the same remote code, its config naming it `gte` (architecture GteModel)
    "arctic-m-v2.0": (1, 160_000.0, None, "", "gte"),
}


@pytest.mark.parametrize("head", ["none", "mean"])
@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
def test_the_pooled_and_per_token_outputs_equal_the_modeling_math(checkpoint: str, head: str, tmp_path: Path) -> None:
    types, theta, scaling, prefix, model_type = CHECKPOINTS[checkpoint]
    config = hub_config(types, theta, scaling)
    if model_type != "new":
        config |= {"model_type": model_type, "architectures": ["GteModel"]}
    weights = write_checkpoint(tmp_path / "checkpoint", config, prefix)
    result = convert_encoder(tmp_path / "checkpoint", tmp_path / "model.onnx", head)
    difference = max_difference(result.path, head, config, weights)
    assert difference <= TOLERANCE, f"{checkpoint} {head}: max abs difference {difference:.2e}"


@pytest.mark.parametrize("head", ["cls", "seq-cls", "token-cls", "mlm-splade"])
def test_the_task_heads_read_gtes_own_tensor_names(head: str, tmp_path: Path) -> None:
    """`new.pooler.dense` + `classifier` (NewForSequenceClassification), `classifier` on every token, and the
    `lm_head` of NewForMaskedLM with its own decoder."""
    config = hub_config(2, 10_000.0, NTK)
    weights = write_checkpoint(tmp_path / "checkpoint", config, "new.")
    result = convert_encoder(tmp_path / "checkpoint", tmp_path / "model.onnx", head)
    assert result.labels == tuple(f"LABEL_{index}" for index in range(LABELS))
    difference = max_difference(result.path, head, config, weights)
    assert difference <= TOLERANCE, f"{head}: max abs difference {difference:.2e}"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("logn_attention_scale", True),
        ("position_embedding_type", "absolute"),
        ("layer_norm_type", "rms_norm"),
        ("pack_qkv", False),
        ("hidden_act", "silu"),
        ("rope_scaling", {"type": "linear", "factor": 2.0}),
        ("rope_scaling", {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}),
        ("type_vocab_size", -1),
    ],
)
def test_what_the_graph_does_not_build_is_refused_by_name(key: str, value: Any, tmp_path: Path) -> None:
    config = hub_config(0, 10_000.0, None) | {key: value}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError) as raised:
        convert_encoder(tmp_path, tmp_path / "model.onnx", "none")
    assert raised.value.message.startswith(f"{key} ") and raised.value.source.endswith("config.json")
