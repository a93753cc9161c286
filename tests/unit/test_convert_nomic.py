"""NomicBERT (nomic-embed-text-v1/v1.5: `model_type: nomic_bert`) against an independent numpy reference of its
modeling code — `nomic-ai/nomic-bert-2048`, `modeling_hf_nomic_bert.py`: NomicBertEmbeddings (word + token type,
then `emb_ln`), NomicBertAttention (fused `Wqkv`, rotate-half rotary over the whole head with base
`rotary_emb_base`, softmax scaled by sqrt(head_dim)), NomciBertGatedMLP (`fc2(fc11(x) * silu(fc12(x)))`) and
NomicBertBlock with `prenorm: false` (`norm1(attn + x)`, `norm2(mlp + x)`) — since transformers does not ship it.
A tiny random checkpoint with its tensor names and a config shaped like nomic-embed-text-v1.5's is converted by us,
run by onnxruntime and compared at every real token of a right-padded batch (≤ 1e-4)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from safetensors.numpy import save_file

from sie.worker.convert import ConversionError, convert_encoder

HIDDEN, HEADS, INTERMEDIATE, LAYERS, VOCAB, TYPES = 32, 4, 40, 2, 50, 2
LENGTHS = (10, 3, 6)


def nomic_config(**changes: object) -> dict:
    """nomic-embed-text-v1.5's config.json keys, shrunk."""
    config = {
        "model_type": "nomic_bert", "architectures": ["NomicBertModel"],
        "auto_map": {"AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"},
        "activation_function": "swiglu", "causal": False, "prenorm": False, "n_embd": HIDDEN, "n_head": HEADS,
        "n_inner": INTERMEDIATE, "n_layer": LAYERS, "n_positions": 8192, "vocab_size": VOCAB, "type_vocab_size": TYPES,
        "layer_norm_epsilon": 1e-12, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
        "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "max_trained_positions": 2048,
        "use_rms_norm": False, "pad_token_id": 0,
    }  # fmt: skip
    return config | changes


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def tensor(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.3, size=shape).astype(np.float32)

    def linear(name: str, out_features: int, in_features: int, bias: bool) -> dict[str, np.ndarray]:
        weights = {f"{name}.weight": tensor(out_features, in_features)}
        return weights | ({f"{name}.bias": tensor(out_features)} if bias else {})

    def norm(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1.0 + tensor(HIDDEN), f"{name}.bias": tensor(HIDDEN)}

    weights = {"embeddings.word_embeddings.weight": tensor(VOCAB, HIDDEN),
               "embeddings.token_type_embeddings.weight": tensor(TYPES, HIDDEN), **norm("emb_ln")}  # fmt: skip
    for index in range(LAYERS):
        layer = f"encoder.layers.{index}"
        weights |= linear(f"{layer}.attn.Wqkv", 3 * HIDDEN, HIDDEN, config["qkv_proj_bias"])
        weights |= linear(f"{layer}.attn.out_proj", HIDDEN, HIDDEN, config["qkv_proj_bias"])
        weights |= linear(f"{layer}.mlp.fc11", INTERMEDIATE, HIDDEN, config["mlp_fc1_bias"])
        weights |= linear(f"{layer}.mlp.fc12", INTERMEDIATE, HIDDEN, config["mlp_fc1_bias"])
        weights |= linear(f"{layer}.mlp.fc2", HIDDEN, INTERMEDIATE, config["mlp_fc2_bias"])
        weights |= norm(f"{layer}.norm1") | norm(f"{layer}.norm2")
    return weights


def save_checkpoint(directory: Path, config: dict, prefix: str = "") -> dict[str, np.ndarray]:
    weights = random_weights(config)
    directory.mkdir(parents=True)
    save_file({prefix + name: value for name, value in weights.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return {name: value.astype(np.float64) for name, value in weights.items()}


# --- the reference, float64 ------------------------------------------------------------------------------------------


def _norm(x: np.ndarray, w: dict, name: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w[f"{name}.weight"] + w[
        f"{name}.bias"
    ]


def _linear(x: np.ndarray, w: dict, name: str) -> np.ndarray:
    out = x @ w[f"{name}.weight"].T
    return out + w[f"{name}.bias"] if f"{name}.bias" in w else out


def _rotate(x: np.ndarray, base: float) -> np.ndarray:
    """apply_rotary_emb, not interleaved, on [S, heads, head_dim] at positions 0..S-1."""
    dim = x.shape[-1]
    inverse = 1.0 / (base ** (np.arange(0, dim, 2) / dim))
    freqs = np.outer(np.arange(x.shape[0]), inverse)
    cos, sin = np.cos(np.concatenate([freqs, freqs], -1))[:, None], np.sin(np.concatenate([freqs, freqs], -1))[:, None]
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + np.concatenate([-second, first], -1) * sin


def reference(config: dict, w: dict, ids: np.ndarray, types: np.ndarray) -> np.ndarray:
    """One unpadded sequence through NomicBertModel."""
    eps, size = config["layer_norm_epsilon"], HIDDEN // HEADS
    x = _norm(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][types], w,
              "emb_ln", eps)  # fmt: skip
    for index in range(LAYERS):
        layer = f"encoder.layers.{index}"
        qkv = _linear(x, w, f"{layer}.attn.Wqkv").reshape(len(ids), 3, HEADS, size)
        q, k = _rotate(qkv[:, 0], config["rotary_emb_base"]), _rotate(qkv[:, 1], config["rotary_emb_base"])
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(size)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("hqk,khd->qhd", probs, qkv[:, 2]).reshape(len(ids), HIDDEN)
        x = _norm(_linear(context, w, f"{layer}.attn.out_proj") + x, w, f"{layer}.norm1", eps)
        gate = _linear(x, w, f"{layer}.mlp.fc12")
        y = _linear(x, w, f"{layer}.mlp.fc11") * (gate / (1.0 + np.exp(-gate)))
        x = _norm(_linear(y, w, f"{layer}.mlp.fc2") + x, w, f"{layer}.norm2", eps)
    return x


def padded_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    ids = rng.integers(1, VOCAB, size=(len(LENGTHS), max(LENGTHS)))  # padding ids random: only the mask hides them
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
        types[row, length // 2 : length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


@pytest.mark.parametrize(
    ("changes", "prefix"),
    [({}, ""), ({"qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, "rotary_emb_base": 10000},
                "bert.")],
    ids=["v1.5-config", "biases-prefixed"],
)  # fmt: skip
def test_nomic_bert_equals_its_modeling_code(tmp_path: Path, changes: dict, prefix: str) -> None:
    config = nomic_config(**changes)
    weights = save_checkpoint(tmp_path / "model", config, prefix)
    feeds = padded_batch()
    convert_encoder(tmp_path / "model", tmp_path / "mean.onnx", "mean")
    session = ort.InferenceSession(str(tmp_path / "mean.onnx"), providers=["CPUExecutionProvider"])
    hidden, pooled = session.run(["last_hidden_state", "sentence_embedding"], feeds)
    for row, length in enumerate(LENGTHS):
        expected = reference(config, weights, feeds["input_ids"][row, :length], feeds["token_type_ids"][row, :length])
        assert float(np.abs(hidden[row, :length] - expected).max()) <= 1e-4
        mean = expected.mean(0) / np.linalg.norm(expected.mean(0))
        assert float(np.abs(pooled[row] - mean).max()) <= 1e-4


@pytest.mark.parametrize(
    ("changes", "named"),
    [({"prenorm": True}, "prenorm"), ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved"),
     ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
     ({"activation_function": "gelu"}, "activation_function"), ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction")],
)  # fmt: skip
def test_what_the_graph_does_not_build_is_named(tmp_path: Path, changes: dict, named: str) -> None:
    save_checkpoint(tmp_path / "model", nomic_config(**changes))
    with pytest.raises(ConversionError, match=named):
        convert_encoder(tmp_path / "model", tmp_path / "out.onnx", "none")


def test_a_config_without_its_activation_is_not_taken_for_swiglu(tmp_path: Path) -> None:
    config = nomic_config()
    del config["activation_function"]  # NomicBertConfig would give GPT-2's default, not SwiGLU
    save_checkpoint(tmp_path / "model", config)
    with pytest.raises(ConversionError, match="activation_function None"):
        convert_encoder(tmp_path / "model", tmp_path / "out.onnx", "none")


def test_mixture_of_experts_layers_are_refused_by_name(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "model", nomic_config(moe_every_n_layers=2, num_experts=8, moe_top_k=2))
    with pytest.raises(ConversionError, match="mixture-of-experts layers are not built"):
        convert_encoder(tmp_path / "model", tmp_path / "out.onnx", "none")
