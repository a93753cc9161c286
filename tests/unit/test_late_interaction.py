"""ColBERT's conventions of sie.worker.late_interaction that depend on no model: a TopK-Embed checkpoint's recipe
read from its own files, its text prompts (stripped as its reference adapter strips them) and its skip ids, and the
projection cut to its `output_dim`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from sie.tokenization import TextTokenizer
from sie.worker.late_interaction import LateInteraction, checkpoint_recipe, read_projection

WORDS = ["<pad>", "Query", ":", "Document", "a", "b", "c", ","]


def tokenizer(directory: Path) -> TextTokenizer:
    model = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<pad>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.save(str(directory / "tokenizer.json"))
    return TextTokenizer.from_file(directory / "tokenizer.json", 16)


def test_a_topk_checkpoint_sets_its_prompts_caps_and_skip_ids(tmp_path: Path) -> None:
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"query_length": 32, "document_length": 300}))
    config = {"model_type": "topk_embed", "query_template": "Query: ", "scoring_skip_ids": [7], "output_dim": 2}
    recipe = checkpoint_recipe(config, tmp_path)
    assert (recipe["query_max_length"], recipe["doc_max_length"], recipe["doc_skip_ids"]) == (32, 300, [7])
    assert (recipe["doc_prefix"], recipe["skip_special_tokens"]) == ("Document: ", False)
    assert checkpoint_recipe({"model_type": "bert"}, tmp_path) == {}  # any other checkpoint: ColBERT's defaults
    text_tokenizer = tokenizer(tmp_path)
    late = LateInteraction(text_tokenizer, recipe)
    # a query's text is stripped before its prompt; a document's prompt and text are stripped together
    assert late.marked_text("  a b  ", is_query=True) == "Query: a b"
    assert late.marked_text("  a b  ", is_query=False) == "Document:   a b"
    ids = np.asarray([[3, 2, 4, 7, 5]])
    batch = late.pad([text_tokenizer.prepared(ids[0], np.zeros(5, np.int64), False)], [0])
    assert late.kept(batch, 0, is_query=False).tolist() == [True, True, True, False, True]
    assert late.kept(batch, 0, is_query=True).all()


def test_a_topk_head_is_the_projection_cut_to_output_dim(tmp_path: Path) -> None:
    head = np.arange(12, dtype=np.float32).reshape(4, 3)  # [outputs, hidden]
    save_file({"head.weight": head, "model.language_model.norm.weight": np.ones(3, np.float32)},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    (stage,) = read_projection(tmp_path, outputs=2)
    assert stage.out_features == 2 and np.array_equal(np.ones((1, 3), np.float32) @ stage.weight, [[3.0, 12.0]])
    assert read_projection(tmp_path)[0].out_features == 4
    with pytest.raises(ValueError, match="cannot give 5 outputs"):
        read_projection(tmp_path, outputs=5)
