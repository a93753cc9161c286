"""A tiny TopK-Embed checkpoint as its remote code saves one, and the public adapter's text recipe run with
transformers on it (`TopkReference`). torch and transformers (the test extra) are imported when a model is built, not
when this module is imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from tokenizers import Tokenizer

from support.decoder_checkpoints import qwen3_5_vision_config, write_tokenizer

HEAD_WIDTH, OUTPUT_DIM = 48, 40
SKIPPED = ("w3", "w8")  # the checkpoint's scoring_skip_ids
QUERY_LENGTH, DOCUMENT_LENGTH = 6, 64  # its sentence_bert_config.json


@attrs.frozen
class TopkReference:
    """The checkpoint's directory, its backbone (attending both ways, as the reference adapter runs it) and head."""

    directory: Path
    backbone: Any
    head: Any

    def vectors(self, text: str, is_query: bool) -> np.ndarray:
        """The public adapter's text recipe (`_encode_texts`, `_forward_padded`, `_project`) for one text."""
        import torch

        tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
        payload = "Query: " + text.strip() if is_query else ("Document: " + text).strip()
        ids = tokenizer.encode(payload).ids[: QUERY_LENGTH if is_query else DOCUMENT_LENGTH]
        with torch.no_grad():
            hidden = self.backbone.language_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            vectors = torch.nn.functional.normalize(self.head(hidden)[:, :OUTPUT_DIM], dim=-1).numpy()
        skipped = {tokenizer.token_to_id(word) for word in SKIPPED}
        return vectors if is_query else vectors[[token not in skipped for token in ids]]


def save_topk(directory: Path) -> TopkReference:
    """config.json is a Qwen3.5 config (text and vision) under the remote `model_type`, with TopK's keys; `model.*` is
    the Qwen3_5Model, `head.weight` the projection; its sentence_bert_config.json gives the token caps."""
    import torch
    import transformers
    from safetensors.torch import save_file

    tokenizer = write_tokenizer(directory)
    config = qwen3_5_vision_config()
    torch.manual_seed(7)
    backbone = transformers.Qwen3_5Model(config).eval()
    head = torch.nn.Linear(config.text_config.hidden_size, HEAD_WIDTH, bias=False)
    with torch.no_grad():
        for parameter in [*backbone.parameters(), *head.parameters()]:
            parameter.add_(torch.randn_like(parameter) * 0.2)
    tensors = {f"model.{name}": value.contiguous() for name, value in backbone.state_dict().items()}
    save_file({**tensors, "head.weight": head.weight.detach().contiguous()}, directory / "model.safetensors")
    saved = config.to_dict() | {
        "model_type": "topk_embed", "architectures": ["TopkEmbedModel"],
        "auto_map": {"AutoModel": "modeling_topk.TopkEmbedModel"}, "dim": HEAD_WIDTH, "output_dim": OUTPUT_DIM,
        "normalize": True, "query_template": "Query: ", "document_prompt": "Document: ", "image_token_budget": 1280,
        "scoring_skip_ids": [tokenizer.token_to_id(word) for word in SKIPPED],
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(saved))
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"query_length": QUERY_LENGTH, "document_length": DOCUMENT_LENGTH})
    )
    # the reference adapter's load: full-attention layers attend both ways
    backbone.config.text_config.is_causal = False
    for layer in backbone.language_model.layers:
        if hasattr(layer, "self_attn"):
            layer.self_attn.is_causal = False
    return TopkReference(directory, backbone, head)
