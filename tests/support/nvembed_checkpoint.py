"""A tiny NV-Embed checkpoint (nvidia/NV-Embed-v2's architecture, `model_type: nvembed`) and its published recipe
as the reference: a Mistral attending both ways (transformers' own, without the sliding window its config names, as
the remote code masks padding only), then the latent-attention block transcribed in torch from the checkpoint's
`modeling_nvembed.py` (`LatentAttentionModel`: PreNorm cross-attention to learned latents through
`scaled_dot_product_attention`, a GEGLU feed-forward), a mean over the tokens after the instruction's
(`attention_mask[:, :len(tokenizer.tokenize(instruction))] = 0`) and L2 normalisation; each text is the instruction,
the text and the end-of-sequence token (`add_eos`). torch and transformers are imported when a model is built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from support.decoder_checkpoints import IM_START, family_config, random_causal_lm, write_tokenizer

LATENTS, HEADS, HEAD_DIM, WIDTH = 16, 2, 24, 32
TEMPLATE = "w50 {instruction} w51 {text}"  # stands for "Instruct: {instruction}\nQuery: {text}"
INSTRUCTION = "w7 w8"
TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11"]  # longer than the config's sliding window, which is not applied


def _latent_weights(seed: int) -> dict[str, Any]:
    """The block's tensors in the checkpoint's names (under `latent_attention_model.`), random."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def random(*shape: int, scale: float = 0.3) -> Any:
        return torch.randn(*shape, generator=generator) * scale

    inner = HEADS * HEAD_DIM
    return {
        "latents": random(LATENTS, WIDTH, scale=1.0),
        "cross_attend_blocks.0.norm.weight": 1 + random(WIDTH), "cross_attend_blocks.0.norm.bias": random(WIDTH),
        "cross_attend_blocks.0.norm_context.weight": 1 + random(WIDTH),
        "cross_attend_blocks.0.norm_context.bias": random(WIDTH),
        "cross_attend_blocks.0.fn.to_q.weight": random(inner, WIDTH),
        "cross_attend_blocks.0.fn.to_kv.weight": random(2 * inner, WIDTH),
        "cross_attend_blocks.0.fn.to_out.weight": random(WIDTH, inner),
        "cross_attend_blocks.1.norm.weight": 1 + random(WIDTH), "cross_attend_blocks.1.norm.bias": random(WIDTH),
        "cross_attend_blocks.1.fn.net.0.weight": random(8 * WIDTH, WIDTH),
        "cross_attend_blocks.1.fn.net.0.bias": random(8 * WIDTH),
        "cross_attend_blocks.1.fn.net.2.weight": random(WIDTH, 4 * WIDTH),
        "cross_attend_blocks.1.fn.net.2.bias": random(WIDTH),
    }  # fmt: skip


def _latent_reference(weights: dict[str, Any], hidden: Any) -> Any:
    """LatentAttentionModel.forward up to its pooling, on hidden [B, S, width] (modeling_nvembed.py's math)."""
    import torch
    from torch.nn import functional

    def norm(x: Any, name: str) -> Any:
        return functional.layer_norm(x, (WIDTH,), weights[f"{name}.weight"], weights[f"{name}.bias"], eps=1e-5)

    def heads(x: Any) -> Any:  # 'b n (h d) -> (b h) n d'
        batch, length, _ = x.shape
        return x.reshape(batch, length, HEADS, HEAD_DIM).permute(0, 2, 1, 3).reshape(batch * HEADS, length, HEAD_DIM)

    batch, length, _ = hidden.shape
    latents = weights["latents"].expand(batch, LATENTS, WIDTH)
    query = norm(hidden, "cross_attend_blocks.0.norm") @ weights["cross_attend_blocks.0.fn.to_q.weight"].T
    context = norm(latents, "cross_attend_blocks.0.norm_context")
    keys, values = (context @ weights["cross_attend_blocks.0.fn.to_kv.weight"].T).chunk(2, dim=-1)
    attended = functional.scaled_dot_product_attention(heads(query), heads(keys), heads(values))
    attended = attended.reshape(batch, HEADS, length, HEAD_DIM).permute(0, 2, 1, 3).reshape(batch, length, -1)
    x = attended @ weights["cross_attend_blocks.0.fn.to_out.weight"].T + hidden
    widened = functional.linear(norm(x, "cross_attend_blocks.1.norm"), weights["cross_attend_blocks.1.fn.net.0.weight"],
                                weights["cross_attend_blocks.1.fn.net.0.bias"])  # fmt: skip
    value, gate = widened.chunk(2, dim=-1)
    fed = functional.linear(value * functional.gelu(gate), weights["cross_attend_blocks.1.fn.net.2.weight"],
                            weights["cross_attend_blocks.1.fn.net.2.bias"])  # fmt: skip
    return torch.as_tensor(fed + x)


def save_nvembed(directory: Path, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """A tiny NV-Embed checkpoint (config, safetensors, a tokenizer that starts every text with a BOS token); returns
    the reference decoder (transformers' Mistral, no window) and the latent block's tensors."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, processors

    config = family_config("mistral")  # its sliding window (3 tokens) is in the saved text_config
    decoder = random_causal_lm("mistral", seed, config=config).model
    latent = _latent_weights(seed + 1)
    tensors = {f"embedding_model.{name}": value for name, value in decoder.state_dict().items()}
    tensors |= {f"latent_attention_model.{name}": value for name, value in latent.items()}
    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: value.contiguous() for name, value in tensors.items()}, str(directory / "model.safetensors"))
    text_config = config.to_dict() | {"model_type": "bidir_mistral"}
    (directory / "config.json").write_text(json.dumps({
        "model_type": "nvembed", "architectures": ["NVEmbedModel"], "text_config": text_config,
        "latent_attention_config": {"model_type": "latent_attention", "num_latents_value": LATENTS,
                                    "num_cross_heads": HEADS, "cross_dim_head": HEAD_DIM, "hidden_dim": WIDTH,
                                    "latent_dim": WIDTH, "output_normalize": True},
        "padding_side": "right", "is_mask_instruction": True, "add_eos": True, "add_pad_token": True,
        "mask_type": "b", "hidden_size": WIDTH,
    }))  # fmt: skip
    # sentence-transformers files that name another pooling: the recipe's mean wins
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))  # fmt: skip
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": WIDTH,
                                                                     "pooling_mode_lasttoken": True}))  # fmt: skip
    write_tokenizer(directory, eos_token="<|endoftext|>")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))  # <|im_start|> stands for Mistral's <s>
    tokenizer.post_processor = processors.TemplateProcessing(single="<|im_start|> $A",
                                                             special_tokens=[("<|im_start|>", IM_START)])  # fmt: skip
    tokenizer.save(str(directory / "tokenizer.json"))
    reference_config = family_config("mistral")
    reference_config.sliding_window = None
    reference = random_causal_lm("mistral", seed, config=reference_config).model
    reference.load_state_dict(decoder.state_dict())
    return reference, {name: torch.as_tensor(value) for name, value in latent.items()}


def reference_vector(reference: Any, latent: dict[str, Any], ids: list[int], masked: int) -> np.ndarray:
    """NVEmbedModel.forward for one unpadded text: the decoder both ways, the latent block, the mean over the
    positions from `masked` on, normalised."""
    import torch

    with torch.no_grad():
        hidden = reference(torch.tensor([ids]), is_causal=False).last_hidden_state
        states = _latent_reference(latent, hidden)[0].numpy()
    pooled = states[masked:].mean(axis=0)
    return pooled / np.linalg.norm(pooled)


def public_yaml(directory: Path, sie_id: str = "acme/nv-embed") -> dict[str, Any]:
    """The public catalogue's NV-Embed-v2 YAML, on the checkpoint in `directory`."""
    return {
        "sie_id": sie_id, "weights_path": str(directory), "max_sequence_length": 64,
        "tasks": {"encode": {"dense": {"dim": WIDTH}}},
        "profiles": {"default": {
            "adapter_path": "sie_server.adapters.pytorch_embedding:PyTorchEmbeddingAdapter", "max_batch_tokens": 1024,
            "adapter_options": {
                "loadtime": {"trust_remote_code": True, "uses_legacy_transformers_cache": True,
                             "attn_implementation": "eager", "use_model_encode": True},
                "runtime": {"normalize": True, "query_template": TEMPLATE, "default_instruction": INSTRUCTION}}}},
    }  # fmt: skip


def recipe_ids(directory: Path, text: str) -> list[int]:
    """The remote code's input: the text, then the end-of-sequence token, tokenized with the BOS token."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(directory / "tokenizer.json")).encode(f"{text}<|endoftext|>").ids
