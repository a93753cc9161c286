"""Jina's flash XLM-RoBERTa remote code (a config.json naming XLMRobertaFlashConfig and no model_type, tensors
renamed as Jina's `convert_roberta_weights_to_flash.py` renames an XLM-R checkpoint) served from the public YAMLs.

- jina-reranker-v2 (`jina_flash_cross_encoder`, absolute positions): the scores equal the sigmoid of transformers'
  XLMRobertaForSequenceClassification on the checkpoint before the renaming, which is what the flash code computes.
- jina-colbert-v2 (`colbert_rotary_flash`, rotary positions, a root `linear` projection): a document's token vectors
  equal the numpy reference of the rotary layer (NomicBERT's with a GELU MLP, tests/unit/test_convert_nomic.py; the
  public SIE adapter recomputes the model the same way) on the marked text, projected and normalised.

What the flash code computes differently (LoRA adapters, interleaved rotary) is refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.errors import ModelLoadError
from support.encoder_checkpoints import random_model, write_tokenizer
from support.worker_items import encode_items
from unit import test_convert_nomic as nomic

QUERY = "w3 w17 w40"
DOCS = ["w3 w17", "w5 w6 w7 w8 w9 w10 w11", "w40 w41 w3 w90", "w2"]


def flash_state_dict(state: dict[str, Any], layers: int) -> dict[str, Any]:
    """An XLM-R state dict under the flash code's names, as Jina's conversion script writes it: `emb_ln`, the
    query/key/value stacked in `mixer.Wqkv`, `mixer.out_proj`, `norm1`, `mlp.fc1`, `mlp.fc2`, `norm2`."""
    import torch

    renamed = {}
    for name, value in state.items():
        name = name.replace("roberta.embeddings.LayerNorm.", "roberta.emb_ln.")
        name = re.sub(r"^roberta\.encoder\.layer\.", "roberta.encoder.layers.", name)
        for old, new in (("attention.output.LayerNorm", "norm1"), ("output.LayerNorm", "norm2"),
                         ("intermediate.dense", "mlp.fc1"), ("attention.output.dense", "mixer.out_proj"),
                         ("output.dense", "mlp.fc2")):  # fmt: skip
            name = re.sub(rf"^(roberta\.encoder\.layers\.\d+)\.{re.escape(old)}\.", rf"\1.{new}.", name)
        renamed[name] = value
    for layer in range(layers):
        prefix = f"roberta.encoder.layers.{layer}"
        for kind in ("weight", "bias"):
            parts = [renamed.pop(f"{prefix}.attention.self.{part}.{kind}") for part in ("query", "key", "value")]
            renamed[f"{prefix}.mixer.Wqkv.{kind}"] = torch.cat(parts, dim=0)
    return {name: value.contiguous() for name, value in renamed.items()}


def flash_config(config: Any, **changes: Any) -> dict[str, Any]:
    """jina-reranker-v2's config.json for `config`'s shape: no model_type, the remote code's auto_map."""
    return {
        "architectures": ["XLMRobertaForSequenceClassification"],
        "auto_map": {"AutoConfig": "configuration_xlm_roberta.XLMRobertaFlashConfig",
                     "AutoModel": "modeling_xlm_roberta.XLMRobertaModel",
                     "AutoModelForSequenceClassification": "modeling_xlm_roberta.XLMRobertaForSequenceClassification"},
        "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "classifier_dropout": None, "emb_pooler": None,
        "hidden_act": "gelu", "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads, "num_hidden_layers": config.num_hidden_layers,
        "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
        "vocab_size": config.vocab_size, "layer_norm_eps": config.layer_norm_eps, "num_labels": 1,
        "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}, "position_embedding_type": "absolute",
        "torch_dtype": "float32", "use_cache": False, "use_flash_attn": True,
    } | changes  # fmt: skip


def save_flash_reranker(directory: Path, **changes: Any) -> Any:
    """A random one-label XLM-R cross-encoder saved in the flash layout; returns the transformers model."""
    from safetensors.torch import save_file

    model = random_model("xlm-roberta", "seq-cls", num_labels=1)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        flash_state_dict(model.state_dict(), model.config.num_hidden_layers), str(directory / "model.safetensors")
    )
    (directory / "config.json").write_text(json.dumps(flash_config(model.config, **changes)))
    write_tokenizer(directory, "xlm-roberta")
    return model


def public_yaml(weights: Path) -> Any:
    return parse_model_config({
        "sie_id": "jinaai/tiny-reranker-v2", "weights_path": str(weights), "max_sequence_length": 32,
        "inputs": {"text": True}, "tasks": {"score": {}},
        "profiles": {"default": {
            "adapter_path": "sie_server.adapters.jina_flash_cross_encoder:JinaFlashCrossEncoderAdapter",
            "max_batch_tokens": 1024, "compute_precision": "bfloat16",
            "adapter_options": {"loadtime": {"trust_remote_code": True}, "runtime": {}},
        }},
    })  # fmt: skip


def test_the_scores_equal_the_sigmoid_of_xlm_robertas_logits(model_loader, tmp_path: Path) -> None:
    import torch
    import transformers

    reference = save_flash_reranker(tmp_path / "reranker")
    model = public_yaml(tmp_path / "reranker")
    loaded = model_loader.load(model, "default", model.sie_id)
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": QUERY}, score_items=[{"text": doc} for doc in DOCS])  # fmt: skip
    (result,) = loaded.adapter.score([item]).items
    assert result.ok, result.error
    ours = {row["item_id"]: row["score"] for row in result.result}
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path / "reranker")
    encoded = tokenizer([QUERY] * len(DOCS), DOCS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.sigmoid(reference(**encoded).logits[:, 0]).numpy()
    got = np.array([ours[f"item-{index}"] for index in range(len(DOCS))])
    assert np.allclose(got, expected, atol=1e-4, rtol=0)
    assert len(set(np.round(expected, 3))) > 1  # the documents score apart: a wrong tensor would show


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"position_embedding_type": "alibi"}, "position_embedding_type"),
        ({"lora_adaptations": ["retrieval.query"]}, "lora_adaptations"),
        ({"position_embedding_type": "rotary", "rotary_emb_interleaved": True}, "rotary_emb_interleaved"),
    ],
)
def test_what_the_flash_code_computes_differently_fails_the_load_naming_it(
    model_loader, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    save_flash_reranker(tmp_path / "reranker", **change)
    model = public_yaml(tmp_path / "reranker")
    with pytest.raises(ModelLoadError, match=named):
        model_loader.load(model, "default", model.sie_id)


# --- jina-colbert-v2 -------------------------------------------------------------------------------------------------

TOKEN_DIM = 8
COLBERT_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MARKERS = ["[QueryMarker]", "[DocumentMarker]"]
COLBERT_WORDS = [f"w{index}" for index in range(nomic.VOCAB - len(COLBERT_SPECIALS) - len(MARKERS))]
COLBERT_DOCS = ["w3 w17 w40", "w5 w6 w7 w8 w9 w10 w11 w12 w13", "w2"]


def save_jina_colbert(directory: Path, **changes: Any) -> tuple[dict, dict, np.ndarray]:
    """jina-colbert-v2's layout, tiny: the rotary flash XLM-R under `roberta.` with a root `linear.weight`; returns
    (the NomicBERT config the reference reads, its weights, the projection)."""
    from safetensors.numpy import save_file

    reference_config = nomic.nomic_config(activation_function="gelu", qkv_proj_bias=True, mlp_fc1_bias=True,
                                          mlp_fc2_bias=True, rotary_emb_base=20000.0)  # fmt: skip
    weights = nomic.random_weights(reference_config)
    stored = {}
    for name, value in weights.items():
        name = name.replace(".attn.", ".mixer.")
        stored[f"roberta.{name}"] = value
    projection = np.random.default_rng(7).normal(0.0, 0.3, (TOKEN_DIM, nomic.HIDDEN)).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({**stored, "linear.weight": projection}, str(directory / "model.safetensors"))
    config = {
        "architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta",
        "auto_map": {"AutoConfig": "jinaai/xlm-roberta-flash-implementation--configuration_xlm_roberta."
                                   "XLMRobertaFlashConfig",
                     "AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_xlm_roberta.XLMRobertaModel"},
        "hidden_size": nomic.HIDDEN, "num_attention_heads": nomic.HEADS, "intermediate_size": nomic.INTERMEDIATE,
        "num_hidden_layers": nomic.LAYERS, "max_position_embeddings": 8194, "vocab_size": nomic.VOCAB,
        "type_vocab_size": nomic.TYPES, "layer_norm_eps": reference_config["layer_norm_epsilon"], "hidden_act": "gelu",
        "position_embedding_type": "rotary", "rotary_emb_base": 20000.0, "pad_token_id": 1, "bos_token_id": 0,
        "eos_token_id": 2, "use_flash_attn": True, "emb_pooler": None, "torch_dtype": "float32",
    } | changes  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    vocab = {token: index for index, token in enumerate([*COLBERT_SPECIALS, *MARKERS, *COLBERT_WORDS])}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    template = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer.post_processor = template
    tokenizer.add_special_tokens(COLBERT_SPECIALS)
    tokenizer.add_tokens([AddedToken(marker, normalized=False) for marker in MARKERS])
    tokenizer.save(str(directory / "tokenizer.json"))
    return reference_config, {name: value.astype(np.float64) for name, value in weights.items()}, projection


def colbert_yaml(weights: Path) -> Any:
    """jina-colbert-v2's public YAML, its widths tiny."""
    return parse_model_config({
        "sie_id": "jinaai/tiny-colbert-v2", "weights_path": str(weights), "max_sequence_length": 64,
        "inputs": {"text": True}, "tasks": {"encode": {"multivector": {"dim": TOKEN_DIM}}, "score": {}},
        "profiles": {"default": {
            "adapter_path": "sie_server.adapters.colbert_rotary_flash:ColBERTRotaryFlashAdapter",
            "max_batch_tokens": 4096, "compute_precision": "bfloat16",
            "adapter_options": {
                "loadtime": {"code_revision": "845308d0fd72a8406a3e378450e1a09522790419", "token_dim": TOKEN_DIM,
                             "normalize": True, "query_max_length": 8, "skip_special_tokens": False,
                             "doc_punctuation_skiplist": True, "query_prefix": "[QueryMarker]",
                             "doc_prefix": "[DocumentMarker]"},
                "runtime": {"query_max_length": 8, "max_seq_length": 64},
            },
        }},
    })  # fmt: skip


def test_jina_colbert_v2_documents_equal_the_rotary_reference(model_loader, tmp_path: Path) -> None:
    config, weights, projection = save_jina_colbert(tmp_path / "colbert")
    model = colbert_yaml(tmp_path / "colbert")
    loaded = model_loader.load(model, "default", model.sie_id)
    results = loaded.adapter.encode(encode_items(COLBERT_DOCS, is_query=False)).items
    tokenizer = Tokenizer.from_file(str(tmp_path / "colbert" / "tokenizer.json"))
    marker = tokenizer.token_to_id("[DocumentMarker]")
    for text, result in zip(COLBERT_DOCS, results, strict=True):
        assert result.ok, result.error
        ids = tokenizer.encode(text).ids
        ids = np.asarray([ids[0], marker, *ids[1:]], dtype=np.int64)  # the marker after <s>
        hidden = nomic.reference(config, weights, ids, np.zeros_like(ids))
        vectors = hidden @ projection.T.astype(np.float64)
        expected = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
        ours = np.asarray(result.result["multivector"]["values"], dtype=np.float64).reshape(len(ids), TOKEN_DIM)
        assert float(np.abs(ours - expected).max()) <= 1e-4
