"""NV-Embed (nvidia/NV-Embed-v2's architecture, `model_type: nvembed`) against its published recipe
(`support.nvembed_checkpoint`) on a tiny random checkpoint, served through the model loader as the public catalogue's
YAML configures it (`pytorch_embedding`, `use_model_encode`, the `Instruct: … Query: …` template with words of the
test vocabulary): queries and documents of several lengths padded into one batch, and scored; and the latent blocks
the graph does not build, refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.latent_attention import parse_latent_attention_config
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from support.nvembed_checkpoint import (
    INSTRUCTION,
    TEMPLATE,
    TEXTS,
    public_yaml,
    recipe_ids,
    reference_vector,
    save_nvembed,
)
from support.worker_items import encode_items

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def nvembed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("nvembed")
    reference, latent = save_nvembed(directory)
    return directory, reference, latent


def test_queries_and_documents_equal_the_published_recipe(nvembed, model_loader: ModelLoader) -> None:
    directory, reference, latent = nvembed
    loaded = model_loader.load(parse_model_config(public_yaml(directory)), "default", "acme/nv-embed")
    prefix = TEMPLATE.replace("{instruction}", INSTRUCTION).replace("{text}", "")
    masked = len(prefix.split())  # len(tokenizer.tokenize(instruction)): the BOS and all but its last word
    for is_query in (True, False):
        results = loaded.adapter.encode(encode_items(TEXTS, is_query=is_query)).items
        for text, result in zip(TEXTS, results, strict=True):
            assert result.ok, result.error
            ids = recipe_ids(directory, prefix + text if is_query else text)
            expected = reference_vector(reference, latent, ids, masked if is_query else 0)
            assert float(np.abs(np.asarray(result.result["dense"]["values"]) - expected).max()) <= TOLERANCE


def test_scores_are_the_cosines_of_the_recipes_vectors(nvembed, model_loader: ModelLoader) -> None:
    directory, reference, latent = nvembed
    loaded = model_loader.load(parse_model_config(public_yaml(directory)), "default", "acme/nv-embed")
    prefix = TEMPLATE.replace("{instruction}", INSTRUCTION).replace("{text}", "")
    query = reference_vector(reference, latent, recipe_ids(directory, prefix + TEXTS[0]), len(prefix.split()))
    docs = [reference_vector(reference, latent, recipe_ids(directory, text), 0) for text in TEXTS[1:]]
    documents = [{"text": text} for text in TEXTS[1:]]
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": TEXTS[0]}, score_items=documents)  # fmt: skip
    (result,) = loaded.adapter.score([item]).items
    assert result.ok, result.error
    ours = {row["item_id"]: row["score"] for row in result.result}
    assert [ours["item-0"], ours["item-1"]] == pytest.approx([float(doc @ query) for doc in docs], abs=TOLERANCE)


def test_a_yaml_dim_other_than_the_models_fails_the_load(nvembed, model_loader: ModelLoader) -> None:
    directory, _, _ = nvembed
    wrong = parse_model_config({
        "sie_id": "acme/nv-embed-wide", "weights_path": str(directory),
        "tasks": {"encode": {"dense": {"dim": 4096}}},
        "profiles": {"default": {"adapter_path": "sie_server.adapters.pytorch_embedding:PyTorchEmbeddingAdapter",
                                 "max_batch_tokens": 1024}},
    })  # fmt: skip
    with pytest.raises(ModelLoadError, match="32-dimensional dense vectors, but the model's YAML declares dim 4096"):
        model_loader.load(wrong, "default", wrong.sie_id)


@pytest.mark.parametrize(
    ("latent", "named"),
    [({"hidden_dim": 64}, "hidden_dim 64 and latent_dim 32 must both be the decoder's hidden size 32"),
     ({"output_normalize": False}, "output_normalize false is not built"),
     ({"num_cross_heads": 0}, "num_cross_heads must be a positive integer")],
)  # fmt: skip
def test_a_latent_block_the_graph_does_not_build_is_refused_naming_it(latent: dict, named: str) -> None:
    config = {"latent_attention_config": {"num_latents_value": 4, "num_cross_heads": 2, "cross_dim_head": 8,
                                          "hidden_dim": 32, "latent_dim": 32, **latent}}  # fmt: skip
    with pytest.raises(ConversionError, match=named):
        parse_latent_attention_config(config, 32, "config.json")
