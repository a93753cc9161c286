"""The DeBERTa-v2/v3 encoder (the backbone of GLiNER, GLiClass and NLI zero-shot models) converted from random
transformers checkpoints: its hidden states equal `DebertaV2Model`'s on a right-padded batch (≤ 1e-4), with log
buckets that the test sequences reach (8 buckets up to a distance of 16), with v3's defaults (256 buckets), and with
absolute positions, token types and a narrower embedding projected to the hidden size; what the graph does not
build fails the conversion naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from sie.worker.convert import ConversionError, convert_encoder

BASE = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 48,
        "vocab_size": 60, "max_position_embeddings": 64, "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
        "share_att_key": True, "norm_rel_ebd": "layer_norm", "pad_token_id": 0}  # fmt: skip
VARIANTS = {
    "log-buckets": {"position_buckets": 8, "max_relative_positions": 16, "position_biased_input": False,
                    "type_vocab_size": 0},
    "v3-defaults": {"position_buckets": 256, "max_relative_positions": -1, "position_biased_input": False,
                    "type_vocab_size": 0},
    "positions-types-projection": {"position_buckets": 8, "max_relative_positions": 16, "position_biased_input": True,
                                   "type_vocab_size": 2, "embedding_size": 24},
}  # fmt: skip
LENGTHS = [20, 7, 13]  # longer than the log-bucket distance


def save_model(directory: Path, options: dict[str, Any]) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**BASE, **options)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hidden_states_equal_transformers(variant: str, tmp_path: Path) -> None:
    import torch

    model = save_model(tmp_path / "model", VARIANTS[variant])
    convert_encoder(tmp_path / "model", tmp_path / "model.onnx", "none")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ids = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int64)
    types = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = rng.integers(1, BASE["vocab_size"], length)
        types[row, length // 2 : length] = 1 if VARIANTS[variant]["type_vocab_size"] else 0
        mask[row, :length] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    (hidden,) = session.run(None, {node.name: feeds[node.name] for node in session.get_inputs()})
    for row, length in enumerate(LENGTHS):
        with torch.no_grad():
            row_types = torch.from_numpy(types[row : row + 1, :length])
            expected = model(torch.from_numpy(ids[row : row + 1, :length]), token_type_ids=row_types)
        expected = expected.last_hidden_state[0]
        assert float(np.abs(hidden[row, :length] - expected.numpy()).max()) <= 1e-4, (variant, row)


def test_the_last_layer_at_given_rows_equals_transformers_there(tmp_path: Path) -> None:
    """`rows` (what a sequence classifier and GLiClass ask for): the last layer computed at those positions alone
    equals transformers' hidden states there, positions past the log-bucket distance included."""
    import torch
    from onnx import TensorProto

    from sie.worker.convert.encoder_graph import EncoderWeights, graph_inputs
    from sie.worker.convert.encoders import build_backbone, parse_backbone_config
    from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
    from sie.worker.convert.safetensors_io import Checkpoint

    model = save_model(tmp_path / "model", VARIANTS["log-buckets"])
    config = parse_backbone_config(model.config.to_dict(), "test")
    positions = np.array([[0, 19, 9, 3], [6, 0, 2, 2], [12, 1, 0, 7]])
    builder = GraphBuilder()
    encoder = build_backbone(builder, config, EncoderWeights(Checkpoint(tmp_path / "model"), config),
                             rows=builder.const(positions))  # fmt: skip
    output = tensor_info(encoder.hidden, TensorProto.FLOAT, ["batch", 4, BASE["hidden_size"]])
    save_graph(builder.model("rows", graph_inputs(), [output]), tmp_path / "rows.onnx")
    session = ort.InferenceSession(str(tmp_path / "rows.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    ids, mask = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int64), np.zeros((len(LENGTHS), max(LENGTHS)), np.int64)
    for row, length in enumerate(LENGTHS):
        ids[row, :length], mask[row, :length] = rng.integers(1, BASE["vocab_size"], length), 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = session.run(None, {node.name: feeds[node.name] for node in session.get_inputs()})
    for row, length in enumerate(LENGTHS):
        with torch.no_grad():
            expected = model(torch.from_numpy(ids[row : row + 1, :length])).last_hidden_state[0].numpy()
        assert float(np.abs(hidden[row] - expected[positions[row]]).max()) <= 1e-4, row


@pytest.mark.parametrize(
    ("change", "message"),
    [({"share_att_key": False}, "share_att_key"), ({"conv_kernel_size": 3}, "conv_kernel_size"),
     ({"pos_att_type": ["c2p"]}, "pos_att_type"), ({"relative_attention": False}, "relative_attention")],
)  # fmt: skip
def test_what_the_graph_does_not_build_is_named(change: dict, message: str, tmp_path: Path) -> None:
    import json

    save_model(tmp_path / "model", VARIANTS["log-buckets"])
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    (tmp_path / "model" / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ConversionError, match=message):
        convert_encoder(tmp_path / "model", tmp_path / "model.onnx", "none")


def test_a_sequence_classifier_equals_transformers(tmp_path: Path) -> None:
    """DebertaV2ForSequenceClassification (the NLI and cross-encoder shape): the context pooler (dense + GELU on the
    first token) and the classifier, three labels."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.DebertaV2Config(**BASE, **VARIANTS["log-buckets"], num_labels=3)
    model = transformers.DebertaV2ForSequenceClassification(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(tmp_path / "model")
    result = convert_encoder(tmp_path / "model", tmp_path / "model.onnx", "seq-cls")
    assert result.output_names == ("logits",) and len(result.labels) == 3
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    ids = np.zeros((len(LENGTHS), max(LENGTHS)), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = rng.integers(1, BASE["vocab_size"], length)
        mask[row, :length] = 1
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (logits,) = session.run(None, {node.name: feeds[node.name] for node in session.get_inputs()})
    for row, length in enumerate(LENGTHS):
        with torch.no_grad():
            expected = model(torch.from_numpy(ids[row : row + 1, :length])).logits[0].numpy()
        assert float(np.abs(logits[row] - expected).max()) <= 1e-4
