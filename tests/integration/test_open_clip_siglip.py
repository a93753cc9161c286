"""An open_clip SigLIP checkpoint (Marqo's layout: open_clip_config.json, open_clip_model.safetensors, the tokenizer
beside them) served through the worker from the public `siglip.adapter` YAML with `backend: open_clip`, against
open_clip itself loading the same directory (`local-dir:`): the token ids its tokenizer gives (text cleaning
`canonicalize`: case, punctuation, underscores, whitespace), text and image vectors (`encode_text`, `encode_image`
on its own eval transform's pixels), the pixels themselves, and a text query's scores against images (the sigmoid of
its logits). What the conversion does not build is refused by name."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from integration.test_image_text import encode_items, normalized, picture, vectors
from sie.catalog import parse_model_config
from sie.imaging import ImageLimits, ImageProcessor
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.open_clip import convert_open_clip
from support.open_clip_checkpoints import CONTEXT, WIDTH, load_reference, open_clip_yaml, save_open_clip_siglip

TOLERANCE = 1e-4
TEXTS = [
    "a red dress with long sleeves",
    "Red Dress, size M!",  # capitals and punctuation: canonicalize lowers and removes them
    "kids_rain_jacket   YELLOW",  # underscores become spaces; runs of spaces one
    "  leading and trailing\tspaces\n",
    "cafe\u0301 au lait\u3000mug",  # a decomposed accent (NFC) and an ideographic space
    "running shoes: lightweight & breathable (100% cotton) -- [sale] {new} 'quoted' \"double\" ~tilde~",
    "wool winter coat with a hood and a very long description that runs past the sixteen token context",
]


IMAGES = [picture(40, 30, 1), picture(20, 50, 2, fmt="JPEG"), picture(64, 64, 3, mode="L"), picture(32, 32, 4)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("marqo") / "checkpoint"
    save_open_clip_siglip(directory)
    return directory


@pytest.fixture(scope="module")
def served(checkpoint: Path, model_loader) -> Any:
    model = parse_model_config(open_clip_yaml("Marqo/tiny-fashionSigLIP", checkpoint))
    return model_loader.load(model, "default", model.sie_id)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> tuple[Any, Any, Any]:
    return load_reference(checkpoint)


def test_token_ids_equal_open_clips_tokenizer(served: Any, reference: tuple[Any, Any, Any]) -> None:
    _, _, tokenizer = reference
    adapter = served.adapter
    ours = adapter.pad([adapter.fit(t, False, {}) for t in served.tokenizer.encode_batch(TEXTS)], [])
    expected = tokenizer(TEXTS).numpy()
    assert ours.input_ids.shape == expected.shape == (len(TEXTS), CONTEXT)
    assert np.array_equal(ours.input_ids, expected)


def test_text_and_image_vectors_equal_open_clip(served: Any, reference: tuple[Any, Any, Any]) -> None:
    import torch

    model, preprocess, tokenizer = reference
    items = [{"text": text} for text in TEXTS] + [{"images": [{"data": data}]} for data in IMAGES]
    ours = vectors(served.adapter.encode(encode_items(items)).items)
    pixels = torch.stack([preprocess(Image.open(io.BytesIO(data))) for data in IMAGES])
    with torch.no_grad():
        texts = model.encode_text(tokenizer(TEXTS)).numpy()
        images = model.encode_image(pixels).numpy()
    assert np.allclose(ours[: len(TEXTS)], normalized(texts), atol=TOLERANCE, rtol=0)
    assert np.allclose(ours[len(TEXTS) :], normalized(images), atol=TOLERANCE, rtol=0)


def transparent(width: int, height: int, seed: int, mode: str) -> bytes:
    """A PNG whose alpha varies (RGBA, LA) or a palette PNG with a transparent colour (P)."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA").convert(mode)
    buffer = io.BytesIO()
    if mode == "P":
        image.save(buffer, format="PNG", transparency=0)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_image_processor_gives_open_clips_pixels(served: Any, reference: tuple[Any, Any, Any]) -> None:
    """Its pixels, transparent and palette images included (open_clip resizes in the image's own mode and drops
    the transparency when it converts to RGB; transformers composites onto white)."""
    _, preprocess, _ = reference
    processor = ImageProcessor.from_dict(dict(served.adapter.image_processor_config))
    odd = [transparent(40, 30, 7, "RGBA"), transparent(50, 20, 8, "LA"), transparent(30, 45, 9, "P")]
    for data in [*IMAGES, picture(300, 200, 5, fmt="JPEG"), picture(17, 90, 6), *odd]:
        expected = preprocess(Image.open(io.BytesIO(data))).numpy()
        assert np.allclose(processor(data, ImageLimits()), expected, atol=1e-5, rtol=0)


def test_a_text_query_scores_images_with_the_sigmoid_of_open_clips_logits(
    served: Any, reference: tuple[Any, Any, Any]
) -> None:
    import torch

    model, preprocess, tokenizer = reference
    query = "Red Dress, size M!"
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": query}, score_items=[{"id": f"i{n}", "images": [{"data": data}]}
                                                                   for n, data in enumerate(IMAGES)])  # fmt: skip
    (result,) = served.adapter.score([item]).items
    assert result.ok, result.error
    ours = {row["item_id"]: row["score"] for row in result.result}
    pixels = torch.stack([preprocess(Image.open(io.BytesIO(data))) for data in IMAGES])
    with torch.no_grad():
        image_features, text_features, scale, bias = model(pixels, tokenizer([query]))
        expected = torch.sigmoid(scale * text_features @ image_features.T + bias)[0].numpy()
    assert np.allclose([ours[f"i{n}"] for n in range(len(IMAGES))], expected, atol=TOLERANCE, rtol=0)


def edited_copy(checkpoint: Path, directory: Path, edit: Any) -> Path:
    """A copy of the checkpoint whose open_clip_config.json `edit(config)` changed in place."""
    shutil.copytree(checkpoint, directory)
    config = json.loads((directory / "open_clip_config.json").read_text())
    edit(config)
    (directory / "open_clip_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda c: c["model_cfg"]["vision_cfg"].update(timm_model_name="vit_base_patch16_224"), "timm_model_name"),
        (lambda c: c["model_cfg"]["vision_cfg"].update(timm_pool="avg"), "timm_pool"),
        (lambda c: c["model_cfg"]["text_cfg"].update(pool_type="argmax"), "pool_type"),
        (lambda c: c["model_cfg"]["text_cfg"].update(no_causal_mask=False), "no_causal_mask"),
        (lambda c: c["model_cfg"].update(custom_text=False), "custom_text"),
        (lambda c: c["preprocess_cfg"].update(resize_mode="shortest"), "resize_mode"),
        (lambda c: c["model_cfg"]["text_cfg"]["tokenizer_kwargs"].update(clean="ftfy"), "clean"),
    ],
)
def test_what_is_not_built_is_refused_by_name(checkpoint: Path, tmp_path: Path, edit: Any, named: str) -> None:
    directory = edited_copy(checkpoint, tmp_path / "edited", edit)
    with pytest.raises(ConversionError, match=named):
        convert_open_clip(directory, directory, tmp_path / "out")


def test_a_tensor_of_a_layer_not_built_is_named(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    directory = edited_copy(checkpoint, tmp_path / "edited", lambda config: None)
    tensors = load_file(str(directory / "open_clip_model.safetensors"))
    tensors["visual.trunk.blocks.0.ls1.gamma"] = np.ones(WIDTH, dtype=np.float32)  # timm's layer scale
    save_file(tensors, str(directory / "open_clip_model.safetensors"))
    with pytest.raises(ConversionError, match=r"visual\.trunk\.blocks\.0\.ls1\.gamma"):
        convert_open_clip(directory, directory, tmp_path / "out")
