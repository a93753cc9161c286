"""Every BERT-like encoder family against transformers itself: a tiny checkpoint with random weights built and saved
by transformers (`save_pretrained`: its own tensor names, prefixes, ties and shards), converted by us, run by
onnxruntime, and compared with the transformers model on the same padded batch — max abs difference ≤ 1e-4 in
float32 — for every head the family carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from sie.worker.convert import ConversionError, conversion_cache_key, convert_encoder
from support.encoder_checkpoints import FAMILIES, HEADS_BUILT, VOCAB, family_config, random_model

TOLERANCE = 1e-4
# Three sequences of different lengths, right-padded as our tokenizer pads them.
LENGTHS = (9, 4, 6)


def padded_batch(config: Any, with_types: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    pad = config.pad_token_id
    width = max(LENGTHS)
    ids = np.full((len(LENGTHS), width), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        real = rng.integers(2, VOCAB, size=length)  # never the padding id
        ids[row, :length], mask[row, :length] = real, 1
        if with_types:
            types[row, length // 2 : length] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def reference(model: Any, head: str, feeds: dict[str, np.ndarray], with_types: bool) -> np.ndarray:
    """What our graph's output must equal, from the transformers model (and sentence-transformers' pooling math)."""
    import torch

    inputs = {
        "input_ids": torch.from_numpy(feeds["input_ids"]),
        "attention_mask": torch.from_numpy(feeds["attention_mask"]),
    }
    if with_types:
        inputs["token_type_ids"] = torch.from_numpy(feeds["token_type_ids"])
    mask = torch.from_numpy(feeds["attention_mask"]).float()
    with torch.no_grad():
        output = model(**inputs)
        if head in ("seq-cls", "token-cls"):
            return output.logits.numpy()
        if head == "mlm-splade":
            logits = output.logits.masked_fill(mask[..., None] == 0, float("-inf"))
            return torch.log1p(torch.relu(logits.max(dim=1).values)).numpy()
        hidden = output.last_hidden_state
        if head == "none":
            return hidden.numpy()
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True) if head == "mean" else hidden[:, 0]
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def run_graph(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def compared(ours: np.ndarray, theirs: np.ndarray, head: str, mask: np.ndarray) -> float:
    """Max abs difference over what a client can see: per-token outputs at real tokens only."""
    assert ours.shape == theirs.shape
    if head in ("none", "token-cls"):
        ours, theirs = ours[mask.astype(bool)], theirs[mask.astype(bool)]
    return float(np.abs(ours - theirs).max())


FAMILY_HEADS = [
    pytest.param(family, head, id=f"{family}-{head}")
    for family in FAMILIES
    for head in HEADS_BUILT
    if not (family == "electra" and head == "mlm-splade")  # ELECTRA's MLM is its generator: no SPLADE model uses it
]


@pytest.mark.parametrize(("family", "head"), FAMILY_HEADS)
def test_each_head_of_each_family_equals_transformers(family: str, head: str, tmp_path: Path) -> None:
    model = random_model(family, head)
    model.save_pretrained(tmp_path / "checkpoint")
    with_types = model.config.model_type in ("bert", "electra")
    feeds = padded_batch(model.config, with_types)
    result = convert_encoder(tmp_path / "checkpoint", tmp_path / "model.onnx", head)
    ours = run_graph(result.path, feeds)[-1]  # the head's own output comes last
    difference = compared(ours, reference(model, head, feeds, with_types), head, feeds["attention_mask"])
    assert difference <= TOLERANCE, f"{family} {head}: max abs difference {difference:.2e}"


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_a_sharded_half_precision_checkpoint_converts_to_the_same_model(family: str, tmp_path: Path) -> None:
    """`save_pretrained` with a small shard size writes `model.safetensors.index.json` and several shards; in
    float16, every tensor is read widened to float32, as transformers computes on the float32 model."""
    model = random_model(family, "seq-cls").half()
    model.save_pretrained(tmp_path / "checkpoint", max_shard_size="40KB")
    shards = sorted(path.name for path in (tmp_path / "checkpoint").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "checkpoint" / "model.safetensors.index.json").is_file()
    feeds = padded_batch(model.config, with_types=False)
    result = convert_encoder(tmp_path / "checkpoint", tmp_path / "model.onnx", "seq-cls")
    ours = run_graph(result.path, feeds)[0]
    difference = compared(ours, reference(model.float(), "seq-cls", feeds, False), "seq-cls", feeds["attention_mask"])
    assert difference <= TOLERANCE
    key = conversion_cache_key(tmp_path / "checkpoint", "seq-cls")
    (tmp_path / "checkpoint" / shards[-1]).write_bytes((tmp_path / "checkpoint" / shards[-1]).read_bytes() + b" ")
    assert conversion_cache_key(tmp_path / "checkpoint", "seq-cls") != key  # every shard is part of the key


def test_a_shard_the_index_names_but_the_directory_lacks_is_named(tmp_path: Path) -> None:
    model = random_model("bert", "none")
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    missing = sorted(tmp_path.glob("model-*.safetensors"))[0]
    missing.unlink()
    with pytest.raises(ConversionError, match=rf"index\.json: names shard '{missing.name}', which is not in"):
        convert_encoder(tmp_path, tmp_path / "model.onnx", "none")


def test_electra_has_no_splade_head_and_says_so(tmp_path: Path) -> None:
    random_model("electra", "none").save_pretrained(tmp_path)
    with pytest.raises(ConversionError, match="the electra family has no masked-language-model head"):
        convert_encoder(tmp_path, tmp_path / "model.onnx", "mlm-splade")


def test_roberta_positions_follow_the_padding_id_not_the_attention_mask(tmp_path: Path) -> None:
    """transformers counts RoBERTa positions over the ids that are not `pad_token_id`: a padding id inside the
    attended part keeps the padding position, as it does in transformers."""
    model = random_model("roberta", "none")
    model.save_pretrained(tmp_path)
    feeds = padded_batch(model.config, with_types=False)
    feeds["input_ids"][0, 3] = model.config.pad_token_id  # attended, but a padding id
    result = convert_encoder(tmp_path, tmp_path / "model.onnx", "none")
    ours = run_graph(result.path, feeds)[0]
    difference = compared(ours, reference(model, "none", feeds, False), "none", feeds["attention_mask"])
    assert difference <= TOLERANCE


def test_mpnet_distance_buckets_equal_the_modeling_code_for_every_distance() -> None:
    """The buckets are a constant of the graph: computed in numpy, they must equal MPNet's own torch function for
    every key-minus-query distance a 514-position checkpoint allows (float32 rounding at the log boundaries)."""
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from sie.worker.convert.encoder_graph import relative_position_buckets

    distances = np.arange(-1023, 1024)
    theirs = MPNetEncoder.relative_position_bucket(torch.from_numpy(distances)).numpy()
    np.testing.assert_array_equal(relative_position_buckets(distances, 32), theirs)


def test_a_modernbert_config_in_the_hubs_older_layout_converts_to_the_same_model(tmp_path: Path) -> None:
    """ModernBERT configs on the Hub say `global_attn_every_n_layers`, `global_rope_theta` and `local_rope_theta`
    where transformers 5 writes `layer_types` and `rope_parameters`: both mean the same model."""
    import json

    model = random_model("modernbert", "none")
    model.save_pretrained(tmp_path)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.pop("rope_parameters")
    assert config.pop("layer_types") == ["full_attention", "sliding_attention", "sliding_attention"]
    config |= {"global_attn_every_n_layers": 3, "global_rope_theta": rope["full_attention"]["rope_theta"],
               "local_rope_theta": rope["sliding_attention"]["rope_theta"]}  # fmt: skip
    config_path.write_text(json.dumps(config))
    feeds = padded_batch(model.config, with_types=False)
    ours = run_graph(convert_encoder(tmp_path, tmp_path / "model.onnx", "none").path, feeds)[0]
    difference = compared(ours, reference(model, "none", feeds, False), "none", feeds["attention_mask"])
    assert difference <= TOLERANCE


@pytest.mark.parametrize("layers", [3, 4], ids=["last-layer-sliding", "last-layer-global"])
def test_a_modernbert_cls_classifier_and_its_rows_equal_transformers(layers: int, tmp_path: Path) -> None:
    """A ModernBERT classifier with `cls` pooling computes its last layer at the first token alone (a sliding layer
    reads its window's row there, a global one every key), and the backbone at arbitrary rows (a padding position
    among them) gives transformers' hidden states there; the window (4 tokens) is shorter than the batch."""
    import torch
    import transformers
    from onnx import TensorProto

    from sie.worker.convert.encoder_graph import EncoderWeights, graph_inputs
    from sie.worker.convert.encoders import build_backbone, parse_backbone_config
    from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
    from sie.worker.convert.safetensors_io import Checkpoint

    torch.manual_seed(layers)
    changes = {"num_hidden_layers": layers, "layer_types": None, "classifier_pooling": "cls", "num_labels": 3}
    config = transformers.ModernBertConfig(**(family_config("modernbert").to_dict() | changes))
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(tmp_path / "checkpoint")
    feeds = padded_batch(model.config, with_types=False)
    result = convert_encoder(tmp_path / "checkpoint", tmp_path / "model.onnx", "seq-cls")
    difference = compared(run_graph(result.path, feeds)[-1], reference(model, "seq-cls", feeds, False), "seq-cls",
                          feeds["attention_mask"])  # fmt: skip
    assert difference <= TOLERANCE, f"classifier: max abs difference {difference:.2e}"

    backbone = parse_backbone_config(model.config.to_dict(), "test")
    positions = np.array([[8, 0, 4], [3, 1, 7], [0, 5, 2]])
    builder = GraphBuilder()
    encoder = build_backbone(builder, backbone, EncoderWeights(Checkpoint(tmp_path / "checkpoint"), backbone),
                             rows=builder.const(positions))  # fmt: skip
    output = tensor_info(encoder.hidden, TensorProto.FLOAT, ["batch", 3, backbone.hidden_size])
    save_graph(builder.model("rows", graph_inputs(), [output]), tmp_path / "rows.onnx")
    inputs = {name: torch.from_numpy(feeds[name]) for name in ("input_ids", "attention_mask")}
    with torch.no_grad():
        hidden = model.model(**inputs).last_hidden_state.numpy()
    expected = np.take_along_axis(hidden, positions[..., None], axis=1)
    real = np.take_along_axis(feeds["attention_mask"], positions, axis=1).astype(bool)
    ours = run_graph(tmp_path / "rows.onnx", feeds)[-1]
    assert float(np.abs(ours - expected)[real].max()) <= TOLERANCE
