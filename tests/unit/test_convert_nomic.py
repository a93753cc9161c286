"""NomicBERT (nomic-embed-text-v1/v1.5: `model_type: nomic_bert`) against an independent numpy reference of its
modeling code — `nomic-ai/nomic-bert-2048`, `modeling_hf_nomic_bert.py`: NomicBertEmbeddings (word + token type,
then `emb_ln`), NomicBertAttention (fused `Wqkv`, rotate-half rotary over the whole head with base
`rotary_emb_base`, softmax scaled by sqrt(head_dim)), NomciBertGatedMLP (`fc2(fc11(x) * silu(fc12(x)))`) and
NomicBertBlock with `prenorm: false` (`norm1(attn + x)`, `norm2(mlp + x)`) — since transformers does not ship it.
A tiny random checkpoint with its tensor names and a config shaped like nomic-embed-text-v1.5's is converted by us,
run by onnxruntime and compared at every real token of a right-padded batch (≤ 1e-4).

nomic-embed-text-v2-moe likewise: NomicBertMLP (`fc2(gelu(fc1(x)))`) on its dense layers and, on every odd layer,
megablocks' dMoE as contrastors builds it (`layers/block.py`; the same layout the public SIE adapter and fastembed's
port read): a bias-free router, softmax, the top-k weights as they are, `gelu(x @ w1[e].T) @ w2[e]` per chosen expert,
the weighted sum plus one shared bias."""

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
EXPERTS, EXPERT_INNER = 4, 24
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


def moe_config(**changes: object) -> dict:
    """nomic-embed-text-v2-moe's config.json keys, shrunk: GELU MLPs, experts on the odd layers of four."""
    moe = {"activation_function": "gelu", "n_layer": 4, "qkv_proj_bias": True, "mlp_fc1_bias": True,
           "mlp_fc2_bias": True, "num_experts": EXPERTS, "moe_top_k": 2, "moe_every_n_layers": 2,
           "moe_normalize_expert_weights": False, "num_shared_experts": 0, "expert_choice_router": False,
           "moe_impl": "megablocks", "ffn_div": 1}  # fmt: skip
    return nomic_config(**(moe | changes))


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
    for index in range(config["n_layer"]):
        layer = f"encoder.layers.{index}"
        weights |= linear(f"{layer}.attn.Wqkv", 3 * HIDDEN, HIDDEN, config["qkv_proj_bias"])
        weights |= linear(f"{layer}.attn.out_proj", HIDDEN, HIDDEN, config["qkv_proj_bias"])
        if is_moe(config, index):
            weights |= {f"{layer}.mlp.router.layer.weight": tensor(EXPERTS, HIDDEN) * 3,  # routes apart
                        f"{layer}.mlp.experts.mlp.w1": tensor(EXPERTS * EXPERT_INNER, HIDDEN),
                        f"{layer}.mlp.experts.mlp.w2": tensor(EXPERTS * EXPERT_INNER, HIDDEN),
                        f"{layer}.mlp.experts.bias": tensor(HIDDEN)}  # fmt: skip
        elif config.get("activation_function") == "gelu":
            weights |= linear(f"{layer}.mlp.fc1", INTERMEDIATE, HIDDEN, config["mlp_fc1_bias"])
            weights |= linear(f"{layer}.mlp.fc2", HIDDEN, INTERMEDIATE, config["mlp_fc2_bias"])
        else:
            weights |= linear(f"{layer}.mlp.fc11", INTERMEDIATE, HIDDEN, config["mlp_fc1_bias"])
            weights |= linear(f"{layer}.mlp.fc12", INTERMEDIATE, HIDDEN, config["mlp_fc1_bias"])
            weights |= linear(f"{layer}.mlp.fc2", HIDDEN, INTERMEDIATE, config["mlp_fc2_bias"])
        weights |= norm(f"{layer}.norm1") | norm(f"{layer}.norm2")
    return weights


def is_moe(config: dict, index: int) -> bool:
    return bool(config.get("num_experts")) and index % config["moe_every_n_layers"] == 1


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


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


CHOSEN: set[int] = set()  # the experts the reference routed some token to, over a test


def _experts(x: np.ndarray, w: dict, layer: str, top_k: int) -> np.ndarray:
    """megablocks' dMoE on [S, H]: softmax router, top-k weights as they are, GELU experts, one shared bias."""
    logits = x @ w[f"{layer}.mlp.router.layer.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    w1 = w[f"{layer}.mlp.experts.mlp.w1"].reshape(EXPERTS, EXPERT_INNER, HIDDEN)
    w2 = w[f"{layer}.mlp.experts.mlp.w2"].reshape(EXPERTS, EXPERT_INNER, HIDDEN)
    out = np.zeros_like(x)
    for token in range(len(x)):
        for expert in np.argsort(-probs[token])[:top_k]:
            CHOSEN.add(int(expert))
            out[token] += probs[token, expert] * (_gelu(x[token] @ w1[expert].T) @ w2[expert])
    return out + w[f"{layer}.mlp.experts.bias"]


def reference(config: dict, w: dict, ids: np.ndarray, types: np.ndarray) -> np.ndarray:
    """One unpadded sequence through NomicBertModel."""
    eps, size = config["layer_norm_epsilon"], HIDDEN // HEADS
    x = _norm(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][types], w,
              "emb_ln", eps)  # fmt: skip
    for index in range(config["n_layer"]):
        layer = f"encoder.layers.{index}"
        qkv = _linear(x, w, f"{layer}.attn.Wqkv").reshape(len(ids), 3, HEADS, size)
        q, k = _rotate(qkv[:, 0], config["rotary_emb_base"]), _rotate(qkv[:, 1], config["rotary_emb_base"])
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(size)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = np.einsum("hqk,khd->qhd", probs, qkv[:, 2]).reshape(len(ids), HIDDEN)
        x = _norm(_linear(context, w, f"{layer}.attn.out_proj") + x, w, f"{layer}.norm1", eps)
        if is_moe(config, index):
            fed = _experts(x, w, layer, config["moe_top_k"])
        elif config["activation_function"] == "gelu":
            fed = _linear(_gelu(_linear(x, w, f"{layer}.mlp.fc1")), w, f"{layer}.mlp.fc2")
        else:
            gate = _linear(x, w, f"{layer}.mlp.fc12")
            fed = _linear(_linear(x, w, f"{layer}.mlp.fc11") * (gate / (1.0 + np.exp(-gate))), w, f"{layer}.mlp.fc2")
        x = _norm(fed + x, w, f"{layer}.norm2", eps)
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


def test_nomic_v2_moe_equals_its_modeling_code(tmp_path: Path) -> None:
    """Dense GELU layers and megablocks' experts, compared at every real token; the tokens are routed to more than
    two experts, so a wrong expert slice or weight shows."""
    config = moe_config()
    weights = save_checkpoint(tmp_path / "model", config)
    feeds = padded_batch()
    convert_encoder(tmp_path / "model", tmp_path / "mean.onnx", "mean")
    session = ort.InferenceSession(str(tmp_path / "mean.onnx"), providers=["CPUExecutionProvider"])
    (hidden,) = session.run(["last_hidden_state"], feeds)
    CHOSEN.clear()
    for row, length in enumerate(LENGTHS):
        expected = reference(config, weights, feeds["input_ids"][row, :length], feeds["token_type_ids"][row, :length])
        assert float(np.abs(hidden[row, :length] - expected).max()) <= 1e-4
    assert len(CHOSEN) > config["moe_top_k"]


@pytest.mark.parametrize(
    ("changes", "named"),
    [({"num_shared_experts": 1}, "num_shared_experts"), ({"expert_choice_router": True}, "expert_choice_router"),
     ({"moe_normalize_expert_weights": 1.0}, "moe_normalize_expert_weights"), ({"moe_top_k": 9}, "moe_top_k"),
     ({"activation_function": "swiglu"}, "activation_function")],
)  # fmt: skip
def test_what_the_experts_do_not_build_is_named(tmp_path: Path, changes: dict, named: str) -> None:
    save_checkpoint(tmp_path / "model", moe_config(**changes))
    with pytest.raises(ConversionError, match=named):
        convert_encoder(tmp_path / "model", tmp_path / "out.onnx", "none")


@pytest.mark.parametrize(
    ("changes", "named"),
    [({"prenorm": True}, "prenorm"), ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved"),
     ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
     ({"activation_function": "gelu_new"}, "activation_function"),
     ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction")],
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
