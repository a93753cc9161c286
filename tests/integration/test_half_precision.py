"""Encoders in half precision, as a CUDA worker converts them when the profile's `compute_precision` is float16 or
bfloat16: the matrix products in float16 over float16 weights, everything else float32 (`convert/half_precision.py`).
The loader here is a GPU loader whose sessions open on onnxruntime's CPU provider (the device is the seam: there is
no GPU in CI; the CPU provider runs float16 products too), and the models are served through their adapters:
the vectors equal the reference (sentence-transformers, transformers' CLIP and SigLIP) within float16's rounding,
GLiNER's scores (a DeBERTa backbone, an LSTM and the span layer's `If`) equal our float32 graph's. A CPU loader,
and a GPU profile that asks for float32 or nothing, keep float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from integration.test_gliner import LABELS
from integration.test_gliner import TEXTS as SENTENCES
from integration.test_image_text import encode_items as image_items
from integration.test_image_text import picture, vectors
from integration.test_sentence_modules import model_yaml, save_stack
from sie.catalog import parse_model_config
from sie.worker import loading
from sie.worker.loading import ModelLoader
from support.image_text_checkpoints import image_text_yaml, save_image_text_model
from support.open_clip_checkpoints import open_clip_yaml, save_open_clip_siglip
from support.worker_items import encode_items, extract_items
from support.zero_shot_checkpoints import save_gliner

# float16 keeps 11 significant bits: each product's operands and result round by up to 2^-11 relative
RELATIVE = 3e-3
TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w12 w13"]


def with_precision(document: dict[str, Any], precision: str | None) -> Any:
    document["profiles"]["default"]["compute_precision"] = precision
    return parse_model_config(document)


def assert_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    difference = float(np.abs(ours - theirs).max())
    assert difference <= RELATIVE * max(1.0, float(np.abs(theirs).max())), difference
    assert difference > 0, "a float16 graph computes in float16: equal to float32 means it did not"


def product_weights(graph: Path) -> set[int]:
    """The element types of the weights the graph's matrix products read."""
    model = onnx.load(str(graph))
    weights = {tensor.name: tensor.data_type for tensor in model.graph.initializer}
    products = [node for node in model.graph.node if node.op_type in ("MatMul", "Gemm", "Attention", "Conv")]
    return {weights[name] for node in products for name in node.input if name in weights}


def test_a_sentence_transformer_in_float16_encodes_as_sentence_transformers_does(
    gpu_loader: ModelLoader, model_loader: ModelLoader, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    save_stack(tmp_path, "bert", "mean", [(16, "Tanh")])
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
    half = with_precision(model_yaml(tmp_path / "st", 16), "bfloat16")
    files = gpu_loader.prepare(half, "default", half.sie_id)
    assert files.precision == "float16"  # what /v1/models shows under loaded_on
    assert product_weights(files.graph) == {onnx.TensorProto.FLOAT16}
    loaded = gpu_loader.load(half, "default", half.sie_id)
    assert loaded.precision == "float16"
    assert_close(vectors(loaded.adapter.encode(encode_items(TEXTS)).items), reference)
    # float32 where the profile asks for it or says nothing, and on a CPU whatever it says
    for precision in ("float32", None):
        kept = with_precision(model_yaml(tmp_path / "st", 16), precision)
        assert gpu_loader.prepare(kept, "default", kept.sie_id).precision == "float32"
    cpu = model_loader.prepare(half, "default", half.sie_id)
    assert cpu.precision == "float32" and product_weights(cpu.graph) == {onnx.TensorProto.FLOAT}
    stored = {tensor.name for tensor in onnx.load(str(files.graph)).graph.initializer}
    halves = {name.removesuffix(".float16") for name in stored if name.endswith(".float16")}
    assert halves and not halves & stored  # the products' weights are stored in float16 alone


@pytest.mark.parametrize("family", ["clip", "siglip", "open_clip"])
def test_image_and_text_towers_in_float16_equal_the_float32_reference(
    family: str, gpu_loader: ModelLoader, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Both towers (the vision one: its patch Conv and fused attention in float16) against our float32 graphs,
    which equal transformers' and open_clip's to 1e-4 (tests/integration/test_image_text.py,
    test_open_clip_siglip.py)."""
    if family == "open_clip":
        save_open_clip_siglip(tmp_path)
        document = open_clip_yaml("acme/open-clip", tmp_path)
    else:
        save_image_text_model(tmp_path, family)
        document = image_text_yaml(family, f"acme/{family}", tmp_path)
    images = [picture(40, 30, 1), picture(32, 32, 3)]
    items = [{"text": text} for text in TEXTS] + [{"images": [{"data": data, "format": "png"}]} for data in images]
    batch = image_items(items)
    half = with_precision(document, "float16")
    loaded = gpu_loader.load(half, "default", half.sie_id)
    assert loaded.precision == "float16"
    assert product_weights(loading.vision_graph_path(gpu_loader.prepare(half, "default", half.sie_id).graph)) == {
        onnx.TensorProto.FLOAT16
    }
    full = model_loader.load(half, "default", half.sie_id)
    assert_close(vectors(loaded.adapter.encode(batch).items), vectors(full.adapter.encode(batch).items))


@pytest.mark.parametrize("bi_encoder", [False, True], ids=["uni-encoder", "bi-encoder"])
def test_gliner_in_float16_scores_spans_as_its_float32_graph_does(
    bi_encoder: bool, gpu_loader: ModelLoader, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """A DeBERTa GLiNER with its LSTM: the span layer's `If` branches (their products) convert too, and so does a
    bi-encoder's label graph beside the span graph. Every span either side finds clear of the threshold, the other
    finds, with the same score within float16's rounding."""
    save_gliner(tmp_path, labels_encoder=bi_encoder)
    document = {
        "sie_id": "acme/gliner", "weights_path": str(tmp_path / "gliner"), "tasks": {"extract": {}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.gliner:GLiNERAdapter",
                                 "max_batch_tokens": 4096}},
    }  # fmt: skip
    half = with_precision(document, "float16")
    threshold, margin = 0.25, 0.01
    options = {"threshold": threshold, "flat_ner": False, "multi_label": True}
    found = [
        loader.load(half, "default", half.sie_id).adapter.extract(extract_items(SENTENCES, LABELS, **options)).items
        for loader in (gpu_loader, model_loader)
    ]
    spans = []
    for results in found:
        assert all(result.ok for result in results)
        spans.append({(row, e["start"], e["end"], e["label"]): e["score"] for row, result in enumerate(results)
                      for e in result.result["entities"]})  # fmt: skip
    half_spans, full_spans = spans
    if bi_encoder:
        labels_graph = loading.labels_graph_path(gpu_loader.prepare(half, "default", half.sie_id).graph)
        assert product_weights(labels_graph) == {onnx.TensorProto.FLOAT16}
    assert len(full_spans) > 5
    for ours, theirs in ((half_spans, full_spans), (full_spans, half_spans)):
        for key, score in theirs.items():
            if score > threshold + margin:
                assert key in ours and abs(ours[key] - score) <= RELATIVE, (key, score, ours.get(key))
    assert any(half_spans[key] != full_spans[key] for key in half_spans.keys() & full_spans.keys())
