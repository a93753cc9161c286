"""CLIP and SigLIP converted to a text graph and a vision graph, against transformers' `get_text_features` and
`get_image_features` on tiny random checkpoints (`support.image_text_checkpoints`): within 1e-4 on batches of padded
texts of different lengths (CLIP right-padded after its EOS token as its tokenizer pads, pooled at the EOS: the legacy
`eos_token_id` 2 configs at the largest id, the others at eos_token_id's first position; SigLIP padded to its
maximum length, with its padding masked or read) and of random images, with quick_gelu, erf gelu and tanh gelu; the
config the adapter reads (`logit_scale`, `logit_bias`); and an unknown model_type refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from sie.worker.convert.clip import ClipConfig, convert_clip, load_clip_config
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.names import (
    ATTENTION_MASK,
    IMAGE_EMBEDS,
    INPUT_IDS,
    PIXEL_VALUES,
    TEXT_EMBEDS,
    vision_graph_path,
)
from support.image_text_checkpoints import (
    CLIP_BOS,
    CLIP_EOS,
    IMAGE_SIZE,
    LOGIT_BIAS,
    LOGIT_SCALE,
    SIGLIP_POSITIONS,
    VOCAB,
    save_clip,
    save_siglip,
)

TOLERANCE = 1e-4
LENGTHS = [3, 9, 1, 14, 6]  # words per text, before the specials
# name -> (builder, its overrides, how texts are laid out: bos, eos, pad, the lowest word id)
VARIANTS = {
    "clip-quick-gelu": (save_clip, {}, (CLIP_BOS, CLIP_EOS, CLIP_EOS, 3)),
    # transformers' legacy pooling: the largest id of each row, the tokenizer's end token
    "clip-gelu-legacy-eos": (save_clip, {"hidden_act": "gelu", "eos_token_id": 2}, (CLIP_BOS, CLIP_EOS, CLIP_EOS, 3)),
    # eos_token_id below the words' ids, padding with another id: pooled at eos_token_id's position, not the argmax
    "clip-eos-3": (save_clip, {"eos_token_id": 3, "bos_token_id": 2, "pad_token_id": 0}, (2, 3, 0, 4)),
    "siglip": (save_siglip, {}, (None, 1, 1, 2)),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    save, overrides, layout = VARIANTS[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    model = save(directory / "checkpoint", seed=len(request.param), **overrides)
    graph = directory / "out" / "model.onnx"
    config = convert_clip(directory / "checkpoint", graph)
    cpu = ["CPUExecutionProvider"]
    return {"model": model, "config": config, "layout": layout, "graph": graph,
            "text": ort.InferenceSession(str(graph), providers=cpu),
            "vision": ort.InferenceSession(str(vision_graph_path(graph)), providers=cpu)}  # fmt: skip


def texts(config: ClipConfig, layout: tuple[int | None, int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random texts of LENGTHS words laid out as the family's tokenizer does: [bos] words eos, then padding to the
    longest row (CLIP) or to the maximum length (SigLIP), right-aligned with a mask of the real tokens."""
    bos, eos, pad, lowest = layout
    rng = np.random.default_rng(seed)
    rows = [([bos] if bos is not None else []) + rng.integers(lowest, VOCAB - 2, size=n).tolist() + [eos]
            for n in LENGTHS]  # fmt: skip
    width = config.text_max_positions if config.pad_to_max_length else max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return ids, mask


def features(output: Any) -> np.ndarray:
    """get_*_features' embedding: a tensor in transformers 4, the pooler_output of its output in 5."""
    tensor = output if hasattr(output, "numpy") else output.pooler_output
    return tensor.detach().numpy()


def test_text_embeddings_equal_transformers(converted: dict[str, Any]) -> None:
    import torch

    config = converted["config"]
    ids, mask = texts(config, converted["layout"], seed=1)
    (ours,) = converted["text"].run([TEXT_EMBEDS], {INPUT_IDS: ids, ATTENTION_MASK: mask})
    with torch.no_grad():
        theirs = features(converted["model"].get_text_features(input_ids=torch.from_numpy(ids),
                                                               attention_mask=torch.from_numpy(mask)))  # fmt: skip
    assert ours.shape == (len(LENGTHS), config.projection_dim)
    assert np.abs(theirs).max() > 0.1  # the embeddings are not vanishingly small: the tolerance means something
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)


def test_unmasked_text_equals_transformers_without_a_mask(converted: dict[str, Any]) -> None:
    """Every token read, padding too (SigLIP as originally trained; CLIP's causal mask alone)."""
    import torch

    ids, _ = texts(converted["config"], converted["layout"], seed=2)
    (ours,) = converted["text"].run([TEXT_EMBEDS], {INPUT_IDS: ids, ATTENTION_MASK: np.ones_like(ids)})
    with torch.no_grad():
        theirs = features(converted["model"].get_text_features(input_ids=torch.from_numpy(ids)))
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)


def test_image_embeddings_equal_transformers(converted: dict[str, Any]) -> None:
    import torch

    config = converted["config"]
    pixels = np.random.default_rng(3).standard_normal((3, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    (ours,) = converted["vision"].run([IMAGE_EMBEDS], {PIXEL_VALUES: pixels})
    with torch.no_grad():
        theirs = features(converted["model"].get_image_features(pixel_values=torch.from_numpy(pixels)))
    assert ours.shape == (3, config.projection_dim)
    assert np.abs(theirs).max() > 0.1
    np.testing.assert_allclose(ours, theirs, atol=TOLERANCE, rtol=0)
    (single,) = converted["vision"].run([IMAGE_EMBEDS], {PIXEL_VALUES: pixels[1:2]})
    np.testing.assert_allclose(single[0], ours[1], atol=TOLERANCE, rtol=0)


def test_graphs_declare_the_names_the_adapter_reads(converted: dict[str, Any]) -> None:
    config = converted["config"]

    def declared(path: Path) -> dict[str, list[int | str]]:
        graph = onnx.load(str(path), load_external_data=False).graph
        return {value.name: [dim.dim_value or dim.dim_param for dim in value.type.tensor_type.shape.dim]
                for value in [*graph.input, *graph.output]}  # fmt: skip

    assert declared(converted["graph"]) == {INPUT_IDS: ["batch", "sequence"], ATTENTION_MASK: ["batch", "sequence"],
                                            TEXT_EMBEDS: ["batch", config.projection_dim]}  # fmt: skip
    assert declared(vision_graph_path(converted["graph"])) == {
        PIXEL_VALUES: ["batch", 3, IMAGE_SIZE, IMAGE_SIZE],
        IMAGE_EMBEDS: ["batch", config.projection_dim],
    }


def test_config_carries_the_logit_scale_and_bias(converted: dict[str, Any]) -> None:
    config = converted["config"]
    assert config.logit_scale == LOGIT_SCALE  # the stored logarithm, exp not applied
    if config.model_type == "siglip":
        assert config.logit_bias == LOGIT_BIAS
        assert (config.pad_to_max_length, config.text_max_positions) == (True, SIGLIP_POSITIONS)
    else:
        assert config.logit_bias is None
        assert not config.pad_to_max_length
    assert load_clip_config(converted["graph"].parents[1] / "checkpoint") == config


def test_unknown_model_type_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "blip", "text_config": {}}))
    with pytest.raises(ConversionError, match="'blip'") as caught:
        convert_clip(tmp_path, tmp_path / "out" / "model.onnx")
    assert "config.json" in str(caught.value)


def test_malformed_field_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "clip", "vision_config": {"patch_size": "8"}}))
    with pytest.raises(ConversionError, match=r"vision_config\.patch_size"):
        load_clip_config(tmp_path)


def test_an_open_clip_config_without_its_weights_is_refused_naming_them(tmp_path: Path) -> None:
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": {"embed_dim": 8}}))
    with pytest.raises(ConversionError, match="open_clip_model.safetensors or open_clip_pytorch_model.bin"):
        convert_clip(tmp_path, tmp_path / "out.onnx")
