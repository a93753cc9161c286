"""The remote-code families served through the worker as the public catalogue's YAMLs configure them: a JinaBERT v2
checkpoint through the Rust `candle` module (jina-embeddings-v2: mean pooling), a GTE "new" one through `rope_flash`
(gte-multilingual-base: CLS pooling), a NomicBERT one through `candle` (nomic-embed-text-v1.5: mean pooling) and a
NomicBERT with experts through `nomic_flash` (nomic-embed-text-v2-moe: mean pooling) —
loaded by the model loader (config.json read, converted, tokenizer limited to the positions), encoded by the dense
adapter from text, and compared with the numpy reference of each family's modeling code on the same token ids
(≤ 1e-4). The references and checkpoint writers are the converter tests' own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from sie.catalog import parse_model_config
from support.worker_items import encode_items
from unit import test_convert_gte as gte
from unit import test_convert_jina as jina
from unit import test_convert_nomic as nomic

TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11 w12", "w13 w14"]  # word ids stay under every test vocabulary
CANDLE = "sie_server_rust.adapters.candle:CandleEmbeddingAdapter"
ROPE = "sie_server.adapters.rope_flash:RoPEFlashAdapter"


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A BERT-style word-level tokenizer of exactly the model's vocabulary: [PAD] [UNK] [CLS] [SEP], then w0, w1, ..."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    words = [f"w{index}" for index in range(vocab_size - len(specials))]
    vocab = {token: index for index, token in enumerate([*specials, *words])}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(directory / "tokenizer.json"))


def jina_family(directory: Path) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    config = jina.jina_config(4, "geglu")
    weights = jina.save_checkpoint(directory, config)

    def hidden(ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": ids[None], "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
                 "token_type_ids": np.zeros((1, len(ids)), dtype=np.int64)}  # fmt: skip
        return jina.reference(config, weights, feeds)[0]

    return hidden, jina.HIDDEN


def gte_family(directory: Path) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    config = gte.hub_config(1, 160_000.0, None)
    weights = gte.write_checkpoint(directory, config)
    return lambda ids: gte.reference_hidden(config, weights, ids, np.zeros_like(ids)), gte.HIDDEN


def nomic_family(directory: Path) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    config = nomic.nomic_config()
    weights = nomic.save_checkpoint(directory, config)
    return lambda ids: nomic.reference(config, weights, ids, np.zeros_like(ids)), nomic.HIDDEN


def nomic_moe_family(directory: Path) -> tuple[Callable[[np.ndarray], np.ndarray], int]:
    config = nomic.moe_config()
    weights = nomic.save_checkpoint(directory, config)
    return lambda ids: nomic.reference(config, weights, ids, np.zeros_like(ids)), nomic.HIDDEN


NOMIC_FLASH = "sie_server.adapters.nomic_flash:NomicFlashAdapter"  # nomic-embed-text-v2-moe's YAML
VOCABS = {"jina-bert-v2": jina.VOCAB, "gte-new": gte.VOCAB, "nomic-bert": nomic.VOCAB, "nomic-v2-moe": nomic.VOCAB}
FAMILIES: dict[str, tuple[Callable[[Path], Any], str, str]] = {
    "jina-bert-v2": (jina_family, CANDLE, "mean"),
    "gte-new": (gte_family, ROPE, "cls"),
    "nomic-bert": (nomic_family, CANDLE, "mean"),
    "nomic-v2-moe": (nomic_moe_family, NOMIC_FLASH, "mean"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_worker_serves_the_family_as_its_modeling_code_computes_it(
    model_loader, tmp_path: Path, family: str
) -> None:
    build, adapter_path, pooling = FAMILIES[family]
    hidden_of, width = build(tmp_path / "model")
    write_tokenizer(tmp_path / "model", VOCABS[family])
    model = parse_model_config(
        {
            "sie_id": f"acme/{family}",
            "weights_path": str(tmp_path / "model"),
            "max_sequence_length": 8192,
            "tasks": {"encode": {"dense": {"dim": width}}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 1024,
                                     "adapter_options": {"runtime": {"pooling": pooling, "normalize": True}}}},
        }
    )  # fmt: skip
    loaded = model_loader.load(model, "default", model.sie_id)
    tokenizer = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    results = loaded.adapter.encode(encode_items(TEXTS)).items
    for text, result in zip(TEXTS, results, strict=True):
        assert result.ok, result.error
        hidden = hidden_of(np.asarray(tokenizer.encode(text).ids, dtype=np.int64))
        pooled = hidden.mean(0) if pooling == "mean" else hidden[0]
        expected = pooled / np.linalg.norm(pooled)
        assert float(np.abs(np.asarray(result.result["dense"]["values"]) - expected).max()) <= 1e-4
