"""The cross-encoder path end to end on random weights: safetensors → seq-cls graph → adapter scores,
checked against the independent numpy BERT (no trained cross-encoder ships on PyPI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from support.bert_reference import VOCAB, reference_outputs, write_checkpoint

WORDS = ["paris", "berlin", "capital", "france", "germany", "is", "the", "of", "what", "cell", "city"]


def write_tokenizer(directory: Path) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    assert len(vocab) <= VOCAB
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.add_special_tokens(["[PAD]", "[CLS]", "[SEP]"])
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer


def test_cross_encoder_scores_match_the_numpy_reference(model_loader, tmp_path: Path) -> None:
    weights = write_checkpoint(tmp_path, "F32")
    tokenizer = write_tokenizer(tmp_path)
    model = parse_model_config(
        {
            "sie_id": "acme/random-reranker",
            "weights_path": str(tmp_path),
            "max_sequence_length": 20,
            "tasks": {"score": {}},
            "profiles": {"default": {"adapter_path": "sie.adapters.cross_encoder:X", "max_batch_tokens": 64}},
        }
    )
    loaded = model_loader.load(model, "default", model.sie_id)
    query, docs = "what is the capital of france", ["paris is the capital", "the cell", "berlin of germany"]
    item = ScoreBatchItem(
        work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
        query_item={"text": query}, score_items=[{"text": doc} for doc in docs],
    )  # fmt: skip
    ranked = loaded.adapter.score([item]).items[0].result
    expected = []
    for doc in docs:
        encoding = tokenizer.encode(query, doc)
        logits = reference_outputs("seq-cls", weights, encoding.ids, encoding.type_ids)["logits"]
        probabilities = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        expected.append(probabilities[-1])
    by_id = {row["item_id"]: row["score"] for row in ranked}
    assert np.allclose([by_id[f"item-{i}"] for i in range(3)], expected, atol=1e-4)
    assert [row["rank"] for row in ranked] == [0, 1, 2]
    assert [row["score"] for row in ranked] == sorted(by_id.values(), reverse=True)
