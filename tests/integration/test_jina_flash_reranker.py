"""jina-reranker-v2's checkpoint layout (Jina's flash XLM-RoBERTa remote code: a config.json naming
XLMRobertaFlashConfig and no model_type, tensors renamed as Jina's `convert_roberta_weights_to_flash.py` renames an
XLM-R checkpoint) served from the public YAML (`jina_flash_cross_encoder`): the scores equal the sigmoid of
transformers' XLMRobertaForSequenceClassification on the checkpoint before the renaming, which is what the flash code
computes with absolute positions. Its rotary variant is refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.errors import ModelLoadError
from support.encoder_checkpoints import random_model, write_tokenizer

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
    [({"position_embedding_type": "rotary"}, "rotary"), ({"lora_adaptations": ["query"]}, "lora_adaptations")],
)
def test_what_the_flash_code_computes_differently_fails_the_load_naming_it(
    model_loader, tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    save_flash_reranker(tmp_path / "reranker", **change)
    model = public_yaml(tmp_path / "reranker")
    with pytest.raises(ModelLoadError, match=named):
        model_loader.load(model, "default", model.sie_id)
