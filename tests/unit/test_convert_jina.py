"""JinaBERT v2 (jina-embeddings-v2-*: `model_type: bert` with ALiBi and a gated feed-forward) against an independent
numpy reference of its modeling code — `jinaai/jina-bert-implementation`, `modeling_bert.py` (JinaBertSelfAttention
with the ALiBi tensor of `JinaBertEncoder.rebuild_alibi_tensor`, `JinaBertGLUMLP`), whose math TEI's
`backends/candle/src/models/jina.rs` also follows — since transformers does not ship it. A tiny random checkpoint
is written with JinaBERT's own tensor names and a config shaped like the Hub's, converted by us, run by onnxruntime
and compared at every real token of a right-padded batch (≤ 1e-4)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from safetensors.numpy import save_file

from sie.worker.convert import ConversionError, convert_encoder
from sie.worker.convert.encoder_graph import EncoderWeights, alibi_slopes, build_encoder, graph_inputs
from sie.worker.convert.families import parse_encoder_config
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
from sie.worker.convert.safetensors_io import Checkpoint

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, TYPES = 48, 40, 2, 60, 2
LENGTHS = (11, 4, 7)


def jina_config(heads: int, feed_forward: str) -> dict:
    """A config with the keys jina-embeddings-v2-base-en's has."""
    return {
        "model_type": "bert", "architectures": ["JinaBertForMaskedLM"],
        "auto_map": {"AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel"},
        "hidden_size": HIDDEN, "num_attention_heads": heads, "num_hidden_layers": LAYERS,
        "intermediate_size": INTERMEDIATE, "vocab_size": VOCAB, "type_vocab_size": TYPES,
        "max_position_embeddings": 8192, "position_embedding_type": "alibi", "feed_forward_type": feed_forward,
        "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0, "emb_pooler": "mean",
    }  # fmt: skip


def random_weights(prefix: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def tensor(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.3, size=shape).astype(np.float32)

    def norm(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1.0 + tensor(HIDDEN), f"{name}.bias": tensor(HIDDEN)}

    weights = {
        "embeddings.word_embeddings.weight": tensor(VOCAB, HIDDEN),
        "embeddings.token_type_embeddings.weight": tensor(TYPES, HIDDEN),
        **norm("embeddings.LayerNorm"),
    }
    for index in range(LAYERS):
        layer = f"encoder.layer.{index}"
        for part in ("query", "key", "value"):
            weights[f"{layer}.attention.self.{part}.weight"] = tensor(HIDDEN, HIDDEN)
            weights[f"{layer}.attention.self.{part}.bias"] = tensor(HIDDEN)
        weights[f"{layer}.attention.output.dense.weight"] = tensor(HIDDEN, HIDDEN)
        weights[f"{layer}.attention.output.dense.bias"] = tensor(HIDDEN)
        weights.update(norm(f"{layer}.attention.output.LayerNorm"))
        weights[f"{layer}.mlp.gated_layers.weight"] = tensor(2 * INTERMEDIATE, HIDDEN)
        weights[f"{layer}.mlp.wo.weight"] = tensor(HIDDEN, INTERMEDIATE)
        weights[f"{layer}.mlp.wo.bias"] = tensor(HIDDEN)
        weights.update(norm(f"{layer}.mlp.layernorm"))
    return {prefix + name: value for name, value in weights.items()}


def save_checkpoint(directory: Path, config: dict, prefix: str = "") -> dict[str, np.ndarray]:
    weights = random_weights(prefix)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    return {name.removeprefix(prefix): value for name, value in weights.items()}


# --- the reference: JinaBertModel's forward, in numpy --------------------------------------------------------------


def _layer_norm(x: np.ndarray, weights: dict, name: str, eps: float = 1e-12) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weights[f"{name}.weight"] + weights[f"{name}.bias"]


def _linear(x: np.ndarray, weights: dict, name: str) -> np.ndarray:
    out = x @ weights[f"{name}.weight"].T
    return out + weights[f"{name}.bias"] if f"{name}.bias" in weights else out


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def reference_slopes(heads: int) -> list[float]:
    """The ALiBi paper's slopes, 2^(-8 (i+1) / n), interleaved from 2n heads beyond the largest power of two."""
    if math.log2(heads).is_integer():
        return [2.0 ** (-8.0 * (index + 1) / heads) for index in range(heads)]
    below = 2 ** math.floor(math.log2(heads))
    return reference_slopes(below) + reference_slopes(2 * below)[0::2][: heads - below]


def reference(config: dict, weights: dict, feeds: dict[str, np.ndarray]) -> np.ndarray:
    heads, size = config["num_attention_heads"], HIDDEN // config["num_attention_heads"]
    ids, types, mask = feeds["input_ids"], feeds["token_type_ids"], feeds["attention_mask"]
    x = weights["embeddings.word_embeddings.weight"][ids] + weights["embeddings.token_type_embeddings.weight"][types]
    x = _layer_norm(x.astype(np.float64), weights, "embeddings.LayerNorm")
    positions = np.arange(ids.shape[1])
    alibi = -np.asarray(reference_slopes(heads))[:, None, None] * np.abs(positions[None, :] - positions[:, None])
    padding = np.where(mask[:, None, None, :] == 1, 0.0, -np.inf)
    activation = _gelu if config["feed_forward_type"] == "geglu" else (lambda v: np.maximum(v, 0.0))
    for index in range(LAYERS):
        layer = f"encoder.layer.{index}"

        def split(v: np.ndarray) -> np.ndarray:
            return v.reshape(*v.shape[:2], heads, size).transpose(0, 2, 1, 3)

        q, k, v = (split(_linear(x, weights, f"{layer}.attention.self.{part}")) for part in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + alibi[None] + padding
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(x.shape)
        attended = _linear(context, weights, f"{layer}.attention.output.dense")
        x = _layer_norm(attended + x, weights, f"{layer}.attention.output.LayerNorm")
        both = _linear(x, weights, f"{layer}.mlp.gated_layers")
        gated, plain = both[..., :INTERMEDIATE], both[..., INTERMEDIATE:]
        out = _linear(activation(gated) * plain, weights, f"{layer}.mlp.wo")
        x = _layer_norm(out + x, weights, f"{layer}.mlp.layernorm")
    return x


def padded_batch() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    ids = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int64)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        ids[row, :length], mask[row, :length] = rng.integers(1, VOCAB, size=length), 1
        types[row, length // 2 : length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def run(path: Path, feeds: dict[str, np.ndarray], output: str = "last_hidden_state") -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run([output], feeds)[0]


@pytest.mark.parametrize(
    ("heads", "feed_forward", "prefix"),
    [(4, "geglu", ""), (6, "geglu", "bert."), (4, "reglu", "")],
    ids=["4-heads-geglu", "6-heads-geglu-prefixed", "4-heads-reglu"],
)
def test_jina_bert_equals_its_modeling_code(tmp_path: Path, heads: int, feed_forward: str, prefix: str) -> None:
    config = jina_config(heads, feed_forward)
    weights = save_checkpoint(tmp_path / "model", config, prefix)
    feeds = padded_batch()
    expected = reference(config, weights, feeds)
    convert_encoder(tmp_path / "model", tmp_path / "none.onnx", "none")
    hidden = run(tmp_path / "none.onnx", feeds)
    real = feeds["attention_mask"] == 1
    assert float(np.abs(hidden[real] - expected[real]).max()) <= 1e-4
    convert_encoder(tmp_path / "model", tmp_path / "mean.onnx", "mean")
    mask = feeds["attention_mask"][..., None]
    pooled = (expected * mask).sum(1) / mask.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    assert float(np.abs(run(tmp_path / "mean.onnx", feeds, "sentence_embedding") - pooled).max()) <= 1e-4


def test_the_last_layer_at_given_rows_alone_equals_its_modeling_code(tmp_path: Path) -> None:
    """What a cross-encoder's or GLiClass's graph computes (`rows`: the last layer's queries at those positions alone,
    ALiBi's rows of them added): those tokens' states of the reference, from a right-padded batch (a padding position
    among them)."""
    config = jina_config(4, "geglu")
    weights = save_checkpoint(tmp_path / "model", config)
    feeds = padded_batch()
    parsed = parse_encoder_config(json.loads((tmp_path / "model" / "config.json").read_text()), source="test")
    positions = np.array([[0, 5, 10], [1, 3, 6], [2, 0, 6]])
    builder = GraphBuilder()
    encoder = build_encoder(builder, parsed, EncoderWeights(Checkpoint(tmp_path / "model"), parsed),
                            rows=builder.const(positions))  # fmt: skip
    output = tensor_info(encoder.hidden, TensorProto.FLOAT, ["batch", 3, HIDDEN])
    save_graph(builder.model("rows", graph_inputs(), [output]), tmp_path / "rows.onnx")
    ours = run(tmp_path / "rows.onnx", feeds, encoder.hidden)
    expected = np.take_along_axis(reference(config, weights, feeds), positions[..., None], axis=1)
    assert ours.shape == (len(LENGTHS), 3, HIDDEN)
    assert float(np.abs(ours - expected).max()) <= 1e-4


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 6, 8, 12, 16, 20])
def test_alibi_slopes_are_the_papers(heads: int) -> None:
    assert np.allclose(alibi_slopes(heads), reference_slopes(heads), rtol=1e-6)


def test_an_unknown_feed_forward_type_is_named(tmp_path: Path) -> None:
    config = jina_config(4, "swiglu")
    save_checkpoint(tmp_path / "model", config)
    with pytest.raises(ConversionError, match="feed_forward_type 'swiglu'"):
        convert_encoder(tmp_path / "model", tmp_path / "out.onnx", "none")
