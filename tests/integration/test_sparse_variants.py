"""The sparse encoders' variants of the public catalogue, on a tiny random masked-LM checkpoint saved by transformers:
inference-free models (OpenSearch `doc-*`: a query is each distinct token weighed by the model's `idf.json` or
`query_token_weights.txt`, never run through the model, as OpenSearch encodes queries) and the `gte_sparse_flash`
module's double log (opensearch doc-v3-gte: log1p(log1p(relu(logits)))). Documents equal SPLADE over transformers'
logits (≤ 1e-4); scores are the dot product of the query's table weights with the document's vector."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import EncodeBatchItem, ScoreBatchItem
from support.encoder_checkpoints import VOCAB, WORDS, save_checkpoint

QUERY, DOCS = "w1 w2 w3 w1 w9", ["w1 w4 w5", "w2 w2 w6 w7 w8"]
WEIGHTS = {"w1": 2.0, "w2": 0.5, "w3": 0.0, "w4": 1.25, "[CLS]": 9.0}  # w9 has none; [CLS] is special
SPLADE = "sie_server.adapters.splade_flash.adapter:SpladeFlashAdapter"
GTE_SPARSE = "sie_server.adapters.gte_sparse_flash:GTESparseFlashAdapter"


def model_yaml(directory: Path, adapter_path: str) -> Any:
    return parse_model_config(
        {
            "sie_id": "acme/doc-sparse",
            "weights_path": str(directory),
            "max_sequence_length": 32,
            "tasks": {"encode": {"sparse": {"dim": VOCAB}}, "score": {}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 512}},
        }
    )


def token_id(word: str) -> int:
    return 4 + WORDS.index(word)  # the test tokenizer: [PAD] [UNK] [CLS] [SEP], then the words


def doc_reference(model: Any, tokenizer: Any, text: str, double_log: bool) -> np.ndarray:
    import torch

    ids = tokenizer.encode(text).ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))).logits[0]
    weights = torch.log1p(torch.relu(logits)).max(dim=0).values
    weights = torch.log1p(weights) if double_log else weights
    weights[[0, 1, 2, 3]] = 0.0  # special tokens are left out of SIE's sparse output
    return weights.numpy()


def encode(loaded: Any, texts: list[str], is_query: bool) -> list[np.ndarray]:
    items = [EncodeBatchItem(work_item_id=f"e.{i}", request_id="e", item_index=i, total_items=len(texts), timestamp=0.0,
                             item={"text": text}, is_query=is_query) for i, text in enumerate(texts)]  # fmt: skip
    dense = []
    for result in loaded.adapter.encode(items).items:
        assert result.ok, result.error
        vector = np.zeros(VOCAB, dtype=np.float32)
        vector[np.asarray(result.result["sparse"]["indices"])] = result.result["sparse"]["values"]
        dense.append(vector)
    return dense


@pytest.mark.parametrize(
    ("weights_file", "adapter_path"),
    [("idf.json", SPLADE), ("query_token_weights.txt", SPLADE), ("idf.json", GTE_SPARSE)],
    ids=["idf-json", "query-token-weights", "gte-sparse-double-log"],
)
def test_inference_free_queries_are_weighed_by_the_table_and_documents_run_the_model(
    model_loader, tmp_path: Path, weights_file: str, adapter_path: str
) -> None:
    from tokenizers import Tokenizer

    model = save_checkpoint(tmp_path, "bert", "mlm-splade")
    if weights_file.endswith(".json"):
        (tmp_path / weights_file).write_text(json.dumps(WEIGHTS))
    else:
        (tmp_path / weights_file).write_text("".join(f"{token}\t{weight}\n" for token, weight in WEIGHTS.items()))
    config = model_yaml(tmp_path, adapter_path)
    loaded = model_loader.load(config, "default", config.sie_id)
    (query,) = encode(loaded, [QUERY], is_query=True)
    expected_query = np.zeros(VOCAB, dtype=np.float32)
    expected_query[[token_id("w1"), token_id("w2")]] = [2.0, 0.5]  # distinct tokens once; w3 is 0, w9 unweighed
    assert np.array_equal(query, expected_query)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    docs = encode(loaded, DOCS, is_query=False)
    for text, ours in zip(DOCS, docs, strict=True):
        expected = doc_reference(model, tokenizer, text, double_log=adapter_path == GTE_SPARSE)
        assert float(np.abs(ours - expected).max()) <= 1e-4
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": QUERY}, score_items=[{"text": doc} for doc in DOCS])  # fmt: skip
    (scored,) = loaded.adapter.score([item]).items
    scores = {row["item_id"]: row["score"] for row in scored.result}
    for index, doc in enumerate(docs):
        assert scores[f"item-{index}"] == pytest.approx(float(doc @ expected_query), abs=1e-4)
