"""TopK-Embed (the public `topk_embed` module: a Qwen3.5 language model attending both ways, every token's state
projected by the checkpoint's `head.weight`, cut to `output_dim`, normalised) against its reference recipe run with
transformers on a tiny random checkpoint of its layout: the same token vectors for queries (`Query: ` + the stripped
text, every token) and documents (`Document: ` + the text, stripped, without `scoring_skip_ids`), MaxSim scores, the
public YAML as the wheel has it, and page images refused by name."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import load_yaml, parse_model_config
from sie.wire.ipc_batch import EncodeBatchItem
from sie.worker.loading import ModelLoader
from support.topk_checkpoint import OUTPUT_DIM, TopkReference, save_topk
from support.worker_items import encode_items

TOLERANCE = 1e-4
QUERIES = ["w1 w2 w3", "  w4 w3 w9  "]
DOCS = ["w5 w3 w6 w7 w8 w9 w10", "w3", "w11 w12  "]


@pytest.fixture(scope="module")
def topk(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """A TopK-Embed checkpoint as its remote code saves one (`support.topk_checkpoint`): its directory, the backbone
    (attending both ways, as the reference adapter runs it) and the head."""
    saved = save_topk(tmp_path_factory.mktemp("topk"))
    return saved.directory, saved.backbone, saved.head


def reference(topk: tuple[Path, Any, Any], text: str, is_query: bool) -> np.ndarray:
    """The public adapter's text recipe for one text."""
    return TopkReference(*topk).vectors(text, is_query)


def entry(directory: Path, **profile: Any) -> Any:
    return parse_model_config({
        "sie_id": "acme/topk", "weights_path": str(directory),
        "tasks": {"encode": {"multivector": {"dim": OUTPUT_DIM}}, "score": {}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.topk_embed.adapter:TopkEmbedAdapter",
                                 "max_batch_tokens": 4096, **profile}},
    })  # fmt: skip


def multivectors(loaded: Any, texts: list[str], is_query: bool) -> list[np.ndarray]:
    results = loaded.adapter.encode(encode_items(texts, is_query=is_query)).items
    assert all(result.ok for result in results), [result.error for result in results]
    return [np.asarray(result.result["multivector"]["values"]) for result in results]


@pytest.mark.parametrize("loader", ["model_loader", "gpu_loader"])
def test_token_vectors_equal_the_reference_recipe(topk, loader: str, request: pytest.FixtureRequest) -> None:
    """On the CPU, and through a GPU loader (the projection in the device graph; float32 here so that it is exact:
    the sessions of tests/integration/conftest.py's GPU loader run on the CPU provider)."""
    directory, backbone, _ = topk
    model_loader: ModelLoader = request.getfixturevalue(loader)
    loaded = model_loader.load(entry(directory, compute_precision="float32"), "default", "acme/topk")
    try:
        for texts, is_query in ((QUERIES, True), (DOCS, False)):
            for text, ours in zip(texts, multivectors(loaded, texts, is_query), strict=True):
                expected = reference(topk, text, is_query)
                assert ours.shape == expected.shape, (text, is_query)
                assert float(np.abs(ours - expected).max()) <= TOLERANCE, (text, is_query)
        # the query cap (sentence_bert_config's query_length) cut the long query; documents lost their skip ids
        assert multivectors(loaded, ["w1 w2 w4 w5 w6 w7 w9"], True)[0].shape == (6, OUTPUT_DIM)
        assert multivectors(loaded, ["w3"], False)[0].shape == (2, OUTPUT_DIM)  # the prompt's "Document" and ":"
    finally:
        loaded.close()


def test_the_reference_attends_both_ways(topk) -> None:
    """The check above can fail on the direction: the same backbone run causally answers otherwise."""
    import torch

    _, backbone, _ = topk
    ids = torch.tensor([[4, 9, 11, 12, 30]])
    with torch.no_grad():
        both_ways = backbone.language_model(input_ids=ids).last_hidden_state
        backbone.config.text_config.is_causal = True
        for layer in backbone.language_model.layers:
            if hasattr(layer, "self_attn"):
                layer.self_attn.is_causal = True
        try:
            causal = backbone.language_model(input_ids=ids).last_hidden_state
        finally:
            backbone.config.text_config.is_causal = False
            for layer in backbone.language_model.layers:
                if hasattr(layer, "self_attn"):
                    layer.self_attn.is_causal = False
    assert float((both_ways - causal).abs().max()) > 100 * TOLERANCE


def test_the_public_yaml_serves_a_checkpoint_of_its_layout(topk, public_wheel: Path, model_loader: ModelLoader) -> None:
    """topk-embed-v1-xsmall's YAML as the wheel has it, with the test checkpoint (its declared width set to the test
    head's): the reference's vectors, in float16 as its runtime `output_dtype` asks."""
    directory, _, _ = topk
    with zipfile.ZipFile(public_wheel) as wheel:
        text = wheel.read("sie_server/models/topk-io__topk-embed-v1-xsmall.yaml").decode()
    data = load_yaml(text, "topk-io__topk-embed-v1-xsmall.yaml") | {"weights_path": str(directory)}
    data["tasks"]["encode"]["multivector"]["dim"] = OUTPUT_DIM
    loaded = model_loader.load(parse_model_config(data), "default", "topk-io/topk-embed-v1-xsmall")
    try:
        for texts, is_query in ((QUERIES, True), (DOCS, False)):
            for text, ours in zip(texts, multivectors(loaded, texts, is_query), strict=True):
                assert ours.dtype == np.float16
                assert float(np.abs(ours - reference(topk, text, is_query)).max()) <= 1e-3, text
    finally:
        loaded.close()


def test_a_page_image_is_refused_naming_it(topk, model_loader: ModelLoader) -> None:
    """The vision tower is not built: an image document (with text or without) is a clear per-item error, never its
    text encoded alone; its text neighbours are served."""
    directory, _, _ = topk
    loaded = model_loader.load(entry(directory), "default", "acme/topk")
    try:
        pages = [
            EncodeBatchItem(work_item_id=f"e.{index}", request_id="e", item_index=index, total_items=3, timestamp=0.0,
                            item={"images": [{"data": b"\x89PNG", "format": "png"}], **text}, is_query=False)
            for index, text in ((1, {}), (2, {"text": "w1"}))
        ]  # fmt: skip
        results = loaded.adapter.encode([*encode_items(DOCS[:1], is_query=False), *pages]).items
        assert results[0].ok
        for result in results[1:]:
            assert not result.ok and result.error_code == "INVALID_INPUT"
            assert "image inputs are not served" in str(result.error)
    finally:
        loaded.close()
