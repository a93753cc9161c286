"""CLIP and SigLIP served through the worker (the public `clip` and `siglip.adapter` YAML shapes) against
transformers on the same tiny random checkpoints: text vectors equal `get_text_features` on the family's own
tokenization (SigLIP padded to its full length, no mask), image vectors equal `get_image_features` on the PIL image
processor's pixel values, L2-normalised as `normalize` says, the images of one item averaged; pixel values the
sidecar prepared give the same vectors; a broken image is refused alone; and a batch mixing text and image items
keeps their order."""

from __future__ import annotations

import io
from typing import Any

import attrs
import numpy as np
import pytest
from PIL import Image

from sie.catalog import parse_model_config
from sie.imaging import ImageProcessor
from sie.wire.ipc_batch import EncodeBatchItem, PreparedPixels, ScoreBatchItem
from support.image_text_checkpoints import CLIP_PROCESSOR, SIGLIP_PROCESSOR, image_processor, save_image_text_model

TOLERANCE = 1e-4
TEXTS = ["w5 w9 w10", "w40", "w3 w4 w5 w6 w7 w8 w9 w11 w12"]
ADAPTERS = {
    "clip": "sie_server.adapters.clip:CLIPAdapter",
    "siglip": "sie_server.adapters.siglip.adapter:SiglipAdapter",
}


def picture(width: int, height: int, seed: int, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").convert(mode).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module", params=sorted(ADAPTERS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> Any:
    family = request.param
    directory = tmp_path_factory.mktemp(family)
    reference = save_image_text_model(directory, family)
    width = 24 if family == "clip" else 32  # CLIP's projection; SigLIP's pooled width
    model = parse_model_config({
        "sie_id": f"acme/{family}", "weights_path": str(directory),
        "max_sequence_length": 20 if family == "clip" else 16, "inputs": {"text": True, "image": True},
        "tasks": {"encode": {"dense": {"dim": width}}},
        "profiles": {"default": {"adapter_path": ADAPTERS[family], "max_batch_tokens": 4096,
                                 "adapter_options": {"runtime": {"normalize": family == "clip"}}}},
    })  # fmt: skip
    adapter = model_loader.load(model, "default", model.sie_id).adapter
    return family, reference, adapter, directory


def encode_items(items: list[dict], **fields: Any) -> list[EncodeBatchItem]:
    return [
        EncodeBatchItem(
            work_item_id=f"x.{index}",
            request_id="x",
            item_index=index,
            total_items=len(items),
            timestamp=0.0,
            item=item,
            **fields,
        )  # fmt: skip
        for index, item in enumerate(items)
    ]


def vectors(results: list[Any]) -> np.ndarray:
    for result in results:
        assert result.ok, result.error
    return np.stack([np.asarray(result.result["dense"]["values"], dtype=np.float32) for result in results])


def normalized(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float32)
    return array / np.linalg.norm(array, axis=-1, keepdims=True)


def reference_texts(family: str, reference: Any, directory: Any) -> np.ndarray:
    import torch
    import transformers

    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    with torch.no_grad():
        if family == "clip":
            encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
            return reference.get_text_features(**encoded).pooler_output.numpy()
        encoded = tokenizer(TEXTS, padding="max_length", max_length=16, return_tensors="pt")
        return reference.get_text_features(input_ids=encoded["input_ids"]).pooler_output.numpy()


def reference_images(family: str, reference: Any, images: list[bytes]) -> np.ndarray:
    import torch

    pixels = image_processor(family)([Image.open(io.BytesIO(data)) for data in images], return_tensors="np")
    with torch.no_grad():
        output = reference.get_image_features(pixel_values=torch.tensor(pixels["pixel_values"]))
    return output.pooler_output.numpy()


def test_text_and_image_vectors_equal_transformers(served: Any) -> None:
    family, reference, adapter, directory = served
    images = [picture(40, 30, 1), picture(20, 50, 2, fmt="JPEG"), picture(32, 32, 3, mode="L")]
    items = [{"text": text} for text in TEXTS] + [{"images": [{"data": data, "format": "png"}]} for data in images]
    ours = vectors(adapter.encode(encode_items(items)).items)
    texts = reference_texts(family, reference, directory)
    pictures = reference_images(family, reference, images)
    if family == "clip":  # the YAML normalises CLIP's vectors, not SigLIP's
        texts, pictures = normalized(texts), normalized(pictures)
    assert np.allclose(ours[: len(TEXTS)], texts, atol=TOLERANCE, rtol=0)
    assert np.allclose(ours[len(TEXTS) :], pictures, atol=TOLERANCE, rtol=0)


def test_an_items_images_are_averaged_after_normalising(served: Any) -> None:
    family, reference, adapter, _ = served
    images = [picture(40, 30, 4), picture(64, 64, 5)]
    item = {"images": [{"data": data} for data in images]}
    (ours,) = vectors(adapter.encode(encode_items([item], options={"normalize": True})).items)
    expected = normalized(reference_images(family, reference, images)).mean(axis=0)
    assert np.allclose(ours, expected, atol=TOLERANCE, rtol=0)


def test_pixels_the_sidecar_prepared_give_the_same_vectors(served: Any) -> None:
    family, _, adapter, _ = served
    data = picture(50, 40, 6)
    processor = ImageProcessor.from_dict(CLIP_PROCESSOR if family == "clip" else SIGLIP_PROCESSOR)
    from sie.imaging import ImageLimits

    pixels = PreparedPixels(pixel_values=processor(data, ImageLimits())[None])
    item = {"images": [{"data": data}]}
    (here,) = vectors(adapter.encode(encode_items([item])).items)
    (prepared,) = vectors(adapter.encode(encode_items([item], prepared_pixels=pixels)).items)
    assert np.array_equal(here, prepared)
    (refused,) = adapter.encode(encode_items([item], prepared_pixels=PreparedPixels(error="Image 0: cut short"))).items
    assert not refused.ok and refused.error_code == "INVALID_INPUT" and "cut short" in refused.error


def test_a_broken_image_is_refused_alone(served: Any) -> None:
    _, _, adapter, _ = served
    good = picture(30, 30, 7)
    items = [{"images": [{"data": good}]}, {"images": [{"data": good[:40]}]}, {"images": [{"data": b"GIF89a??"}]},
             {"text": "w7 w8"}, {"images": [{"format": "png"}]}]  # fmt: skip
    results = adapter.encode(encode_items(items)).items
    assert results[0].ok and results[3].ok
    for result in (results[1], results[2], results[4]):
        assert not result.ok and result.error_code == "INVALID_INPUT", result
    (sparse,) = adapter.encode(encode_items([{"images": [{"data": good}]}], output_types=["sparse"])).items
    assert not sparse.ok and "output types" in sparse.error


def test_a_text_query_scores_images_with_the_models_own_similarity(served: Any) -> None:
    """CLIP: exp(logit_scale) × cosine, transformers' logits_per_text; SigLIP: the sigmoid of that plus its bias."""
    import torch
    import transformers

    family, reference, adapter, directory = served
    images = [picture(40, 30, 8), picture(30, 40, 9), picture(36, 36, 10)]
    query = "w5 w9 w10"
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": query}, score_items=[{"id": f"i{n}", "images": [{"data": data}]}
                                                                   for n, data in enumerate(images)])  # fmt: skip
    (result,) = adapter.score([item]).items
    assert result.ok, result.error
    ours = {row["item_id"]: row["score"] for row in result.result}
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    pixels = image_processor(family)([Image.open(io.BytesIO(data)) for data in images], return_tensors="pt")
    with torch.no_grad():
        if family == "clip":
            encoded = tokenizer([query], return_tensors="pt")
            logits = reference(**encoded, pixel_values=pixels["pixel_values"]).logits_per_text[0]
            expected = logits.numpy()
        else:
            ids = tokenizer([query], padding="max_length", max_length=16, return_tensors="pt")["input_ids"]
            logits = reference(input_ids=ids, pixel_values=pixels["pixel_values"]).logits_per_text[0]
            expected = torch.sigmoid(logits).numpy()
    assert np.allclose([ours[f"i{n}"] for n in range(3)], expected, atol=TOLERANCE, rtol=0)
    # the sidecar's pixels of each entry (query: text, so none) give the same scores
    processor = ImageProcessor.from_dict(CLIP_PROCESSOR if family == "clip" else SIGLIP_PROCESSOR)
    from sie.imaging import ImageLimits

    pixels = [None] + [PreparedPixels(pixel_values=processor(data, ImageLimits())[None]) for data in images]
    (prepared,) = adapter.score([attrs.evolve(item, prepared_pixels=pixels)]).items
    assert {row["item_id"]: row["score"] for row in prepared.result} == ours
    assert [row["rank"] for row in result.result] == [0, 1, 2]
    texts = ScoreBatchItem(work_item_id="s.1", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                           query_item={"images": [{"data": images[0]}]}, score_items=[{"text": "w7"}, {}])  # fmt: skip
    (refused,) = adapter.score([texts]).items
    assert not refused.ok and "needs a text or images" in refused.error
