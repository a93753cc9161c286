"""Tiny random image–text checkpoints (CLIPModel, SiglipModel) built and saved by transformers itself (its tensor
names and config.json): hidden width 32, 2 layers, 4 heads, 32-pixel images in 8-pixel patches, a 100-token
vocabulary. Every parameter is moved off its initial value (zero biases, unit LayerNorms), and `logit_scale` /
`logit_bias` are set, so a converter that skips or swaps a tensor shows. torch and transformers (the test extra) are
imported when a model is built, not when this module is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 100
CLIP_POSITIONS, SIGLIP_POSITIONS = 20, 16
IMAGE_SIZE, PATCH_SIZE = 32, 8
TOWER = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4}
# A real CLIP tokenizer's layout: <|startoftext|> ids <|endoftext|>, padded after; its two specials are the
# vocabulary's last ids, so the legacy argmax of the ids finds the end token.
CLIP_BOS, CLIP_EOS = VOCAB - 2, VOCAB - 1
LOGIT_SCALE, LOGIT_BIAS = 2.75, -8.5


def save_clip(directory: Path, seed: int = 0, projection_dim: int = 24, **text_overrides: Any) -> Any:
    """A random CLIPModel saved in `directory` (eval mode, returned); `text_overrides` set text_config keys
    (`hidden_act`, `eos_token_id`, `pad_token_id`, ...), and `hidden_act` the vision tower's too."""
    import transformers

    text = {**TOWER, "vocab_size": VOCAB, "max_position_embeddings": CLIP_POSITIONS, "bos_token_id": CLIP_BOS,
            "eos_token_id": CLIP_EOS, "pad_token_id": CLIP_EOS} | text_overrides  # fmt: skip
    vision = {**TOWER, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    if "hidden_act" in text_overrides:
        vision["hidden_act"] = text_overrides["hidden_act"]
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection_dim)
    return _save(transformers.CLIPModel(config), directory, seed)


def save_siglip(directory: Path, seed: int = 0, **text_overrides: Any) -> Any:
    """A random SiglipModel saved in `directory` (eval mode, returned); `text_overrides` set text_config keys."""
    import transformers

    text = {**TOWER, "vocab_size": VOCAB, "max_position_embeddings": SIGLIP_POSITIONS, "bos_token_id": None,
            "eos_token_id": 1, "pad_token_id": 1} | text_overrides  # fmt: skip
    vision = {**TOWER, "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
    config = transformers.SiglipConfig(text_config=text, vision_config=vision)
    return _save(transformers.SiglipModel(config), directory, seed)


def _save(model: Any, directory: Path, seed: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name == "logit_scale":
                parameter.fill_(LOGIT_SCALE)
            elif name == "logit_bias":
                parameter.fill_(LOGIT_BIAS)
            else:
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(noise * 0.05)
    model.eval()
    model.save_pretrained(directory)
    return model


def write_tokenizer(directory: Path, family: str) -> None:
    """A word-level tokenizer of the checkpoint's vocabulary laid out as the family's own: CLIP's
    `<|startoftext|> words <|endoftext|>` (its specials the last ids), SigLIP's `words </s>` (T5's `<pad>`, `</s>`,
    `<unk>` first); words are `w3`, `w4`, ... split on whitespace."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    if family == "clip":
        specials = {"<|startoftext|>": CLIP_BOS, "<|endoftext|>": CLIP_EOS, "<unk>": 0}
        template = processors.TemplateProcessing(
            single="<|startoftext|> $A <|endoftext|>",
            special_tokens=[("<|startoftext|>", CLIP_BOS), ("<|endoftext|>", CLIP_EOS)],
        )
        config = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                  "unk_token": "<unk>", "model_max_length": CLIP_POSITIONS}  # fmt: skip
    else:
        specials = {"<pad>": 0, "</s>": 1, "<unk>": 2}
        template = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        config = {"eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>", "model_max_length": SIGLIP_POSITIONS}
    vocabulary = dict(specials)
    for index in range(VOCAB):
        if index not in specials.values():
            vocabulary[f"w{index}"] = index
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.add_special_tokens(list(specials))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = template
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config})
    )


CLIP_PROCESSOR = {
    "image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": IMAGE_SIZE},
    "resample": 3, "do_center_crop": True, "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
}  # fmt: skip
SIGLIP_PROCESSOR = {
    "image_processor_type": "SiglipImageProcessor", "do_resize": True,
    "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "resample": 2, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}  # fmt: skip


def save_image_text_model(directory: Path, family: str, seed: int = 0) -> Any:
    """A servable tiny CLIP or SigLIP in `directory`: the checkpoint, its tokenizer and preprocessor_config.json."""
    import json

    model = save_clip(directory, seed) if family == "clip" else save_siglip(directory, seed)
    write_tokenizer(directory, family)
    processor = CLIP_PROCESSOR if family == "clip" else SIGLIP_PROCESSOR
    (directory / "preprocessor_config.json").write_text(json.dumps(processor))
    return model


def image_processor(family: str) -> Any:
    """transformers' PIL image processor of the family with the settings `save_image_text_model` writes."""
    import transformers

    settings = {k: v for k, v in (CLIP_PROCESSOR if family == "clip" else SIGLIP_PROCESSOR).items()
                if k != "image_processor_type"}  # fmt: skip
    kind = transformers.CLIPImageProcessorPil if family == "clip" else transformers.SiglipImageProcessorPil
    return kind(**settings)


# The catalogue ids the shared e2e cluster serves `save_image_text_model`'s checkpoints under.
TINY_IMAGE_TEXT = {"clip": "tiny/clip", "siglip": "tiny/siglip"}
ADAPTER_PATHS = {
    "clip": "sie_server.adapters.clip:CLIPAdapter",
    "siglip": "sie_server.adapters.siglip.adapter:SiglipAdapter",
}


def image_text_yaml(family: str, sie_id: str, weights: Path) -> dict[str, Any]:
    """A model YAML in the public catalogue's shape for a `save_image_text_model` checkpoint: CLIP's vectors
    normalised, SigLIP's not (as the public YAMLs say)."""
    return {
        "sie_id": sie_id, "weights_path": str(weights), "inputs": {"text": True, "image": True},
        "max_sequence_length": CLIP_POSITIONS if family == "clip" else SIGLIP_POSITIONS,
        "tasks": {"encode": {"dense": {"dim": 24 if family == "clip" else TOWER["hidden_size"]}}},
        "profiles": {"default": {"adapter_path": ADAPTER_PATHS[family], "max_batch_tokens": 4096,
                                 "adapter_options": {"runtime": {"normalize": family == "clip"}}}},
    }  # fmt: skip
