"""open_clip's SigLIP checkpoints (a `CustomTextCLIP`: a timm SigLIP ViT as the image tower, open_clip's own
bidirectional text transformer; Marqo's fashion and e-commerce SigLIPs, timm's `ViT-*-SigLIP` repositories) converted
into the same two towers as transformers' SiglipModel, in a directory the image–text adapter serves as it serves a
transformers checkpoint.

An open_clip repository holds `open_clip_config.json` (`model_cfg`: the towers; `preprocess_cfg`: the image
transform) and `open_clip_model.safetensors` (or a torch.save `open_clip_pytorch_model.bin`) in place of config.json
and model.safetensors, and the text tokenizer (`tokenizer.json`) beside them. `convert_open_clip` writes:

- `model.onnx` and its vision graph: `clip.write_towers` over `OpenClipWeights`, which presents open_clip's tensors
  under SiglipModel's names (timm's fused `qkv` and open_clip's `in_proj_weight` split into q, k and v; timm's
  `attn_pool` latent query, `q` and `kv` as the pooling head's probe and `in_proj`). Every tensor of the checkpoint
  must be read, so a layer this mapping does not know (layer scale, a class token, qk-norm) fails the conversion
  naming it instead of being left out;
- `config.json`: the towers as a SiglipConfig says them, which the adapter and the tokenizer's length read;
- `preprocessor_config.json`: `preprocess_cfg` as the SigLIP image processor's settings (open_clip's `squash`
  resize is a resize to the fixed size, no crop, with the same Pillow filter), and open_clip's order: the image
  resized in its own mode, then converted to RGB by Pillow (`sie_rgb_after_resize`: transparency dropped, not
  composited onto white as transformers does);
- `tokenizer.json`: the repository's tokenizer with open_clip's text cleaning (`text_cfg.tokenizer_kwargs.clean`:
  `canonicalize`, `lower` or `whitespace`) as its first normalizers, so the sidecar and the worker tokenize as
  open_clip's HFTokenizer does; `tokenizer_config.json` copied beside it.

What open_clip does and this does not: its `basic_clean` runs ftfy's repairs of mis-decoded text and unescapes HTML
entities before the cleaning; here a text is read as sent (NFC-normalized, as ftfy leaves it), so a text holding
mojibake or `&amp;` tokenizes as written. Checked against open_clip itself on a tiny random checkpoint
(tests/integration/test_open_clip_siglip.py).
"""

from __future__ import annotations

import json
import re
import shutil
import string
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sie.imaging.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, RGB_AFTER_RESIZE_KEY
from sie.worker.convert.clip import ClipConfig, write_towers
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.head_layers import HeadWeights
from sie.worker.convert.names import (
    CONFIG_FILE,
    GRAPH_FILE,
    OPEN_CLIP_CONFIG_FILE,
    OPEN_CLIP_WEIGHTS_FILES,
    PREPROCESSOR_CONFIG_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
)
from sie.worker.convert.safetensors_io import Checkpoint, open_clip_weights_file, read_json
from sie.worker.convert.vision_graph import TowerConfig

# timm's SigLIP ViTs (`vit_base_patch16_siglip_224`, `vit_so400m_patch14_siglip_384`, ...): the size names the heads.
TIMM_SIGLIP_NAME = re.compile(r"^vit_(?P<size>base|large|so400m|giantopt)_patch(?P<patch>\d+)_siglip_(?P<res>\d+)$")
TIMM_SIGLIP_HEADS = {"base": 12, "large": 16, "so400m": 16, "giantopt": 16}
PATCH_EMBEDDING = "visual.trunk.patch_embed.proj.weight"  # timm's patch Conv: [width, channels, patch, patch]
TIMM_LAYER_NORM_EPS = 1e-6  # timm's ViT: LayerNorm(eps=1e-6) everywhere, its attention-pooling head included
OPEN_CLIP_LAYER_NORM_EPS = 1e-5  # open_clip's text LayerNorm unless norm_kwargs say otherwise
# open_clip's eval transform: interpolation names to Pillow's filters (PIL.Image.Resampling) as torchvision maps them.
INTERPOLATIONS = {"bicubic": 3, "bilinear": 2}
CLEAN_MODES = ("canonicalize", "lower", "whitespace")
# The text-tower options a SigLIP-shaped open_clip text transformer leaves at these values (CLIPTextCfg's names).
_TEXT_FIXED: dict[str, Any] = {
    "hf_model_name": None, "tokenizer_mode": None, "embed_cls": False, "no_causal_mask": True, "pool_type": "last",
    "proj_type": "linear", "proj_bias": True, "final_ln_after_pool": False, "ls_init_value": None, "act_kwargs": None,
    "block_type": None, "qk_norm": False, "scaled_cosine_attn": False, "scale_heads": False,
    "scale_attn_inner": False, "scale_attn": False, "scale_fc": False, "output_tokens": False,
}  # fmt: skip
_TEXT_DEFAULTS = {"embed_cls": False, "no_causal_mask": False, "pool_type": "argmax", "proj_type": "linear",
                  "proj_bias": False, "final_ln_after_pool": False, "qk_norm": False, "scaled_cosine_attn": False,
                  "scale_heads": False, "scale_attn_inner": False, "scale_attn": False, "scale_fc": False,
                  "output_tokens": False}  # fmt: skip
_TEXT_READ = {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "norm_kwargs", "pad_id",
              "eos_id", "hf_tokenizer_name", "tokenizer_kwargs"}  # fmt: skip
_VISION_READ = {"image_size", "timm_model_name", "timm_model_pretrained", "timm_pool", "timm_proj", "timm_proj_bias",
                "timm_drop", "timm_drop_path", "patch_dropout"}  # fmt: skip


def convert_open_clip(model_dir: Path, tokenizer_dir: Path, out_dir: Path) -> ClipConfig:
    """Convert the open_clip SigLIP checkpoint in `model_dir` (its tokenizer in `tokenizer_dir`) into `out_dir`:
    the two graphs, config.json, preprocessor_config.json, tokenizer.json and tokenizer_config.json."""
    model_dir, tokenizer_dir, out_dir = Path(model_dir), Path(tokenizer_dir), Path(out_dir)
    source = str(model_dir / OPEN_CLIP_CONFIG_FILE)
    raw = read_json(model_dir / OPEN_CLIP_CONFIG_FILE)
    if not isinstance(raw, dict) or not isinstance(raw.get("model_cfg"), dict):
        raise ConversionError("has no model_cfg object", source=source)
    model_cfg = raw["model_cfg"]
    text_cfg, vision_cfg = _section(model_cfg, "text_cfg", source), _section(model_cfg, "vision_cfg", source)
    path = open_clip_weights_file(model_dir)
    if path is None:
        raise ConversionError(f"no {' or '.join(OPEN_CLIP_WEIGHTS_FILES)}", source=str(model_dir))
    weights = OpenClipWeights(Checkpoint(model_dir, [path]))
    clean = _text_clean(text_cfg, source)
    tokenizer = _read_tokenizer(tokenizer_dir, text_cfg)
    config = _clip_config(model_cfg, text_cfg, vision_cfg, weights, _pad_token_id(tokenizer_dir, tokenizer), source)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_towers(config, weights, out_dir / GRAPH_FILE)
    weights.check_all_read()
    (out_dir / CONFIG_FILE).write_text(json.dumps(_siglip_config_json(config, vision_cfg), indent=2), encoding="utf-8")
    processor = _image_processor(raw.get("preprocess_cfg"), config.image_size, source)
    (out_dir / PREPROCESSOR_CONFIG_FILE).write_text(json.dumps(processor, indent=2), encoding="utf-8")
    tokenizer["normalizer"] = _cleaning_normalizer(clean, tokenizer.get("normalizer"))
    (out_dir / TOKENIZER_FILE).write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    if (tokenizer_dir / TOKENIZER_CONFIG_FILE).is_file():
        shutil.copyfile(tokenizer_dir / TOKENIZER_CONFIG_FILE, out_dir / TOKENIZER_CONFIG_FILE)
    return config


class OpenClipWeights(HeadWeights):
    """An open_clip SigLIP checkpoint read by transformers' SiglipModel tensor names (what `clip.write_towers`
    asks for), recording which stored tensors `get` read (what the graphs hold)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        self.read: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        stored, array = self._array(name)
        self.read.update(_stored_names(name)[0])
        if array.shape != shape and array.shape == (1, *shape):  # timm's pos_embed [1, patches, width]
            array = array.reshape(shape)
        if array.shape != shape:
            raise ConversionError(f"has shape {list(array.shape)}, expected {list(shape)}",
                                  source=str(self._checkpoint.path), tensor=stored)  # fmt: skip
        return array

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._array(name)[1].shape)

    def has(self, name: str) -> bool:
        return all(stored in self._checkpoint for stored in _stored_names(name)[0])

    def _array(self, name: str) -> tuple[str, np.ndarray]:
        """(the first stored name, the tensor SiglipModel calls `name`): stored tensors concatenated, or one part of
        a stacked one."""
        names, part = _stored_names(name)
        for stored in names:
            if stored not in self._checkpoint:
                raise ConversionError("required tensor is missing", source=str(self._checkpoint.path), tensor=stored)
        arrays = [self._checkpoint.load(stored) for stored in names]
        array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        if part is not None:  # one of q, k, v stacked on the first axis
            index, parts = part
            if array.shape[0] % parts:
                raise ConversionError(f"has shape {list(array.shape)}: its first axis does not split in {parts}",
                                      source=str(self._checkpoint.path), tensor=names[0])  # fmt: skip
            rows = array.shape[0] // parts
            array = array[index * rows : (index + 1) * rows]
        return names[0], np.ascontiguousarray(array)

    def stored_shape(self, stored: str) -> tuple[int, ...]:
        """The shape of the stored tensor `stored` (open_clip's name)."""
        if stored not in self._checkpoint:
            raise ConversionError("required tensor is missing", source=str(self._checkpoint.path), tensor=stored)
        return tuple(self._checkpoint.entries[stored].shape)

    def count(self, pattern: str) -> int:
        """How many stored tensor names match `pattern` (a regular expression with one group: a layer index) —
        the distinct indices."""
        found = {match.group(1) for name in self._checkpoint.entries if (match := re.fullmatch(pattern, name))}
        return len(found)

    def check_all_read(self) -> None:
        """ConversionError naming the tensors the towers did not read: layers this conversion does not build."""
        unread = sorted(set(self._checkpoint.entries) - self.read - {"logit_scale", "logit_bias"})
        if unread:
            shown = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
            raise ConversionError(f"holds tensors of layers this conversion does not build: {shown}",
                                  source=str(self._checkpoint.path))  # fmt: skip


# SiglipModel's name (after its layer prefix) → open_clip's, per tower; q/k/v come out of a stacked tensor.
_TEXT_LAYER = {
    "layer_norm1": "ln_1", "layer_norm2": "ln_2", "self_attn.out_proj": "attn.out_proj", "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
}  # fmt: skip
_VISION_LAYER = {
    "layer_norm1": "norm1", "layer_norm2": "norm2", "self_attn.out_proj": "attn.proj", "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}  # fmt: skip
_RENAMED = {
    "text_model.embeddings.token_embedding.weight": "text.token_embedding.weight",
    "text_model.embeddings.position_embedding.weight": "text.positional_embedding",
    "text_model.final_layer_norm.weight": "text.ln_final.weight",
    "text_model.final_layer_norm.bias": "text.ln_final.bias",
    "text_model.head.weight": "text.text_projection.weight",
    "text_model.head.bias": "text.text_projection.bias",
    "vision_model.embeddings.patch_embedding.weight": PATCH_EMBEDDING,
    "vision_model.embeddings.patch_embedding.bias": "visual.trunk.patch_embed.proj.bias",
    "vision_model.embeddings.position_embedding.weight": "visual.trunk.pos_embed",
    "vision_model.post_layernorm.weight": "visual.trunk.norm.weight",
    "vision_model.post_layernorm.bias": "visual.trunk.norm.bias",
    "vision_model.head.probe": "visual.trunk.attn_pool.latent",
    "vision_model.head.attention.out_proj.weight": "visual.trunk.attn_pool.proj.weight",
    "vision_model.head.attention.out_proj.bias": "visual.trunk.attn_pool.proj.bias",
    "vision_model.head.layernorm.weight": "visual.trunk.attn_pool.norm.weight",
    "vision_model.head.layernorm.bias": "visual.trunk.attn_pool.norm.bias",
    "vision_model.head.mlp.fc1.weight": "visual.trunk.attn_pool.mlp.fc1.weight",
    "vision_model.head.mlp.fc1.bias": "visual.trunk.attn_pool.mlp.fc1.bias",
    "vision_model.head.mlp.fc2.weight": "visual.trunk.attn_pool.mlp.fc2.weight",
    "vision_model.head.mlp.fc2.bias": "visual.trunk.attn_pool.mlp.fc2.bias",
}
# The pooling head's nn.MultiheadAttention stacks Q, K and V; timm's AttentionPoolLatent keeps Q apart from K and V.
_STACKED = {
    "vision_model.head.attention.in_proj_weight": (
        "visual.trunk.attn_pool.q.weight",
        "visual.trunk.attn_pool.kv.weight",
    ),
    "vision_model.head.attention.in_proj_bias": ("visual.trunk.attn_pool.q.bias", "visual.trunk.attn_pool.kv.bias"),
}
_LAYER_NAME = re.compile(
    r"^(?P<tower>text|vision)_model\.encoder\.layers\.(?P<index>\d+)\.(?P<rest>.+)\.(?P<kind>weight|bias)$"
)
_QKV = {"self_attn.q_proj": 0, "self_attn.k_proj": 1, "self_attn.v_proj": 2}


def _stored_names(name: str) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """open_clip's tensors for SiglipModel's `name` (more than one: concatenated on the first axis), and
    (index, parts) where the tensor is one of that many parts stacked there."""
    if name in _STACKED:
        return _STACKED[name], None
    if name in _RENAMED:
        return (_RENAMED[name],), None
    if name in ("logit_scale", "logit_bias"):
        return (name,), None
    match = _LAYER_NAME.match(name)
    if match is None:
        raise ConversionError(f"SiglipModel's tensor {name!r} has no open_clip counterpart here", source="open_clip")
    tower, index, rest, kind = match["tower"], match["index"], match["rest"], match["kind"]
    if tower == "text":
        prefix = f"text.transformer.resblocks.{index}"
        if rest in _QKV:
            return (f"{prefix}.attn.in_proj_{kind}",), (_QKV[rest], 3)
        return (f"{prefix}.{_TEXT_LAYER[rest]}.{kind}",), None
    prefix = f"visual.trunk.blocks.{index}"
    if rest in _QKV:
        return (f"{prefix}.attn.qkv.{kind}",), (_QKV[rest], 3)
    return (f"{prefix}.{_VISION_LAYER[rest]}.{kind}",), None


# --- config ---------------------------------------------------------------------------------------------------------


def _section(model_cfg: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    section = model_cfg.get(key)
    if not isinstance(section, dict):
        raise ConversionError(f"model_cfg.{key} is not an object", source=source)
    return section


def _clip_config(  # noqa: PLR0913 - the config's parts and what the checkpoint says beside them
    model_cfg: dict[str, Any], text_cfg: dict[str, Any], vision_cfg: dict[str, Any], weights: OpenClipWeights,
    pad_token_id: int, source: str,
) -> ClipConfig:  # fmt: skip
    """The towers as `clip.write_towers` builds SigLIP's, checked against what this conversion maps."""
    if model_cfg.get("custom_text") is not True:
        raise ConversionError("model_cfg.custom_text is not true: open_clip's CLIP layout (its text tower at the top "
                              "level) is not built; SIE converts open_clip's SigLIPs", source=source)  # fmt: skip
    text = _text_tower(model_cfg, text_cfg, source)
    vision, image_size, patch_size = _vision_tower(vision_cfg, weights, source)
    embed_dim = _int(model_cfg, "embed_dim", 0, source)
    if embed_dim != vision.hidden_size:
        raise ConversionError(f"model_cfg.embed_dim {embed_dim} differs from the image tower's width "
                              f"{vision.hidden_size} (timm_proj 'none' passes the pooled tokens through): the "
                              "embeddings would not compare", source=source)  # fmt: skip
    return ClipConfig(
        model_type="siglip", projection_dim=embed_dim, image_size=image_size, patch_size=patch_size,
        num_channels=weights.stored_shape(PATCH_EMBEDDING)[1],
        text_max_positions=_int(text_cfg, "context_length", 77, source),
        vocab_size=_int(text_cfg, "vocab_size", 49408, source), pad_token_id=pad_token_id, eos_token_id=None,
        pad_to_max_length=True, text=text, vision=vision,
        logit_scale=_scalar(weights, "logit_scale"), logit_bias=_scalar(weights, "logit_bias"),
    )  # fmt: skip


def _text_tower(model_cfg: dict[str, Any], text_cfg: dict[str, Any], source: str) -> TowerConfig:
    """open_clip's TextTransformer as SigLIP's configs set it: bidirectional, pooled at the last position, a Linear
    projection with a bias; its activation GELU (QuickGELU where model_cfg.quick_gelu says)."""
    for key, wanted in _TEXT_FIXED.items():
        value = text_cfg.get(key, _TEXT_DEFAULTS.get(key))
        if value != wanted:
            raise ConversionError(f"model_cfg.text_cfg.{key} is {value!r}: only {wanted!r} is built (open_clip's "
                                  "SigLIP text tower)", source=source)  # fmt: skip
    unknown = sorted(set(text_cfg) - set(_TEXT_FIXED) - _TEXT_READ)
    if unknown:
        raise ConversionError(f"model_cfg.text_cfg.{unknown[0]} is not a setting this conversion reads",
                              source=source)  # fmt: skip
    width, heads = _int(text_cfg, "width", 512, source), _int(text_cfg, "heads", 8, source)
    if width % heads:
        raise ConversionError(f"model_cfg.text_cfg.width {width} is not a multiple of heads {heads}", source=source)
    eps = (text_cfg.get("norm_kwargs") or {}).get("eps", OPEN_CLIP_LAYER_NORM_EPS)
    ratio = text_cfg.get("mlp_ratio", 4.0)
    for key, value in (("norm_kwargs.eps", eps), ("mlp_ratio", ratio)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConversionError(f"model_cfg.text_cfg.{key} is {value!r}: expected a positive number", source=source)
    return TowerConfig(
        hidden_size=width, intermediate_size=int(width * ratio), num_layers=_int(text_cfg, "layers", 12, source),
        num_heads=heads, layer_norm_eps=float(eps), activation="quick_gelu" if model_cfg.get("quick_gelu") else "gelu",
    )  # fmt: skip


def _vision_tower(vision_cfg: dict[str, Any], weights: OpenClipWeights, source: str) -> tuple[TowerConfig, int, int]:
    """timm's SigLIP ViT: its width, depth and MLP width from the checkpoint, its heads, patch and image size from
    the model's name (checked against the checkpoint and `image_size`); also the image and patch sizes."""
    unknown = sorted(set(vision_cfg) - _VISION_READ)
    if unknown:
        raise ConversionError(f"model_cfg.vision_cfg.{unknown[0]} is not a setting this conversion reads (open_clip's "
                              "SigLIPs have a timm image tower)", source=source)  # fmt: skip
    name = vision_cfg.get("timm_model_name")
    match = TIMM_SIGLIP_NAME.match(str(name))
    if match is None:
        raise ConversionError(f"model_cfg.vision_cfg.timm_model_name is {name!r}: the image towers built are timm's "
                              "SigLIP ViTs with attention pooling (vit_{base,large,so400m,giantopt}_patch<N>_siglip_"
                              "<size>)", source=source)  # fmt: skip
    for key, wanted in (("timm_pool", "map"), ("timm_proj", "none")):
        if vision_cfg.get(key) != wanted:
            raise ConversionError(f"model_cfg.vision_cfg.{key} is {vision_cfg.get(key)!r}: only {wanted!r} is built",
                                  source=source)  # fmt: skip
    image_size = vision_cfg.get("image_size", 224)
    if isinstance(image_size, list) and len(image_size) == 2 and image_size[0] == image_size[1]:
        image_size = image_size[0]
    patch_size = weights.stored_shape(PATCH_EMBEDDING)[-1]
    if (int(match["patch"]), int(match["res"])) != (patch_size, image_size):
        raise ConversionError(f"model_cfg.vision_cfg: timm model {name!r} reads {match['res']}-pixel images in "
                              f"{match['patch']}-pixel patches; image_size is {image_size!r} and the checkpoint's "
                              f"patches are {patch_size}", source=source)  # fmt: skip
    width = weights.stored_shape(PATCH_EMBEDDING)[0]
    heads = TIMM_SIGLIP_HEADS[match["size"]]
    if width % heads:
        raise ConversionError(f"the image tower's width {width} is not a multiple of the {heads} heads of a "
                              f"{match['size']} timm ViT", source=source)  # fmt: skip
    tower = TowerConfig(
        hidden_size=width, intermediate_size=weights.stored_shape("visual.trunk.blocks.0.mlp.fc1.weight")[0],
        num_layers=weights.count(r"visual\.trunk\.blocks\.(\d+)\..+"), num_heads=heads,
        layer_norm_eps=TIMM_LAYER_NORM_EPS, activation="gelu",
    )  # fmt: skip
    return tower, image_size, patch_size


def _int(section: dict[str, Any], key: str, default: int, source: str) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConversionError(f"{key} is {value!r}: expected a positive integer", source=source)
    return value


def _scalar(weights: OpenClipWeights, name: str) -> float:
    values = weights.get(name, weights.stored_shape(name))
    if values.size != 1 or not np.isfinite(values).all():
        raise ConversionError(f"is {values.tolist()}: expected one finite number", tensor=name, source="open_clip")
    return float(values.reshape(-1)[0])


def _siglip_config_json(config: ClipConfig, vision_cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers' SiglipConfig writes it for these towers (what the adapter reads)."""

    def tower(section: TowerConfig) -> dict[str, Any]:
        return {"hidden_size": section.hidden_size, "intermediate_size": section.intermediate_size,
                "num_hidden_layers": section.num_layers, "num_attention_heads": section.num_heads,
                "hidden_act": section.activation, "layer_norm_eps": section.layer_norm_eps}  # fmt: skip

    return {
        "model_type": "siglip",
        "text_config": {**tower(config.text), "vocab_size": config.vocab_size, "projection_size": config.projection_dim,
                        "max_position_embeddings": config.text_max_positions, "pad_token_id": config.pad_token_id},
        "vision_config": {**tower(config.vision), "image_size": config.image_size, "patch_size": config.patch_size,
                          "num_channels": config.num_channels},
        "sie_converted_from": {"layout": "open_clip", "timm_model_name": vision_cfg.get("timm_model_name")},
    }  # fmt: skip


def _image_processor(preprocess: Any, image_size: int, source: str) -> dict[str, Any]:
    """open_clip's eval transform (`preprocess_cfg`, PreprocessCfg's defaults for what it leaves out) as the SigLIP
    image processor's settings: `squash` resizes to the fixed size with the named filter, no crop."""
    preprocess = preprocess if preprocess is not None else {}
    if not isinstance(preprocess, dict):
        raise ConversionError("preprocess_cfg is not an object", source=source)
    mode = preprocess.get("resize_mode", "shortest")
    if mode != "squash":
        raise ConversionError(f"preprocess_cfg.resize_mode is {mode!r}: only 'squash' is built (open_clip's "
                              "'shortest' and 'longest' crop with torchvision's rounding)", source=source)  # fmt: skip
    interpolation = preprocess.get("interpolation", "bicubic")
    if interpolation not in INTERPOLATIONS:
        raise ConversionError(f"preprocess_cfg.interpolation is {interpolation!r}: expected one of "
                              f"{', '.join(INTERPOLATIONS)}", source=source)  # fmt: skip
    size = preprocess.get("size", image_size)
    if size not in (image_size, [image_size, image_size]):
        raise ConversionError(f"preprocess_cfg.size is {size!r} but the image tower reads {image_size}-pixel images",
                              source=source)  # fmt: skip
    if preprocess.get("mode", "RGB") != "RGB":
        raise ConversionError(f"preprocess_cfg.mode is {preprocess['mode']!r}: only 'RGB' is built", source=source)
    return {
        "image_processor_type": "SiglipImageProcessor", "do_resize": True,
        "size": {"height": image_size, "width": image_size}, "resample": INTERPOLATIONS[interpolation],
        "do_center_crop": False, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(preprocess.get("mean", OPENAI_CLIP_MEAN)),  # open_clip's PreprocessCfg defaults
        "image_std": list(preprocess.get("std", OPENAI_CLIP_STD)),
        RGB_AFTER_RESIZE_KEY: True,  # open_clip resizes in the image's mode, then converts (transparency dropped)
    }  # fmt: skip


# --- tokenizer ------------------------------------------------------------------------------------------------------


def _text_clean(text_cfg: dict[str, Any], source: str) -> str:
    kwargs = text_cfg.get("tokenizer_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ConversionError("model_cfg.text_cfg.tokenizer_kwargs is not an object", source=source)
    unknown = sorted(set(kwargs) - {"clean", "strip_sep_token"})
    if unknown:
        raise ConversionError(f"model_cfg.text_cfg.tokenizer_kwargs.{unknown[0]} is not built", source=source)
    if kwargs.get("strip_sep_token", False):
        raise ConversionError("model_cfg.text_cfg.tokenizer_kwargs.strip_sep_token is not built", source=source)
    clean = kwargs.get("clean", "whitespace")  # HFTokenizer's default
    if clean not in CLEAN_MODES:
        raise ConversionError(f"model_cfg.text_cfg.tokenizer_kwargs.clean is {clean!r}: expected one of "
                              f"{', '.join(CLEAN_MODES)}", source=source)  # fmt: skip
    return clean


def _read_tokenizer(tokenizer_dir: Path, text_cfg: dict[str, Any]) -> dict[str, Any]:
    path = tokenizer_dir / TOKENIZER_FILE
    if not path.is_file():
        named = text_cfg.get("hf_tokenizer_name")
        raise ConversionError(f"no {TOKENIZER_FILE} beside the open_clip checkpoint (its config names the tokenizer "
                              f"{named!r}; SIE reads it from the checkpoint's directory)",
                              source=str(tokenizer_dir))  # fmt: skip
    tokenizer = read_json(path)
    if not isinstance(tokenizer, dict):
        raise ConversionError("is not a tokenizer object", source=str(path))
    return tokenizer


def _pad_token_id(tokenizer_dir: Path, tokenizer: dict[str, Any]) -> int:
    """The id open_clip pads every text with (its HFTokenizer pads to context_length): the tokenizer's pad token
    as tokenizer_config.json or special_tokens_map.json names it."""
    pad = None
    for name in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE):
        if pad is None and (tokenizer_dir / name).is_file():
            settings = read_json(tokenizer_dir / name)
            pad = settings.get("pad_token") if isinstance(settings, dict) else None
    pad = pad.get("content") if isinstance(pad, dict) else pad
    if not isinstance(pad, str):
        raise ConversionError(
            f"names no pad_token (nor does {SPECIAL_TOKENS_MAP_FILE}): open_clip pads every text "
            "to its context length with it",
            source=str(tokenizer_dir / TOKENIZER_CONFIG_FILE),
        )
    for added in tokenizer.get("added_tokens") or []:
        if isinstance(added, dict) and added.get("content") == pad and isinstance(added.get("id"), int):
            return added["id"]
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(pad), int):
        return vocab[pad]
    if isinstance(vocab, list):  # Unigram: [piece, score] pairs in id order
        for index, entry in enumerate(vocab):
            if isinstance(entry, list) and entry and entry[0] == pad:
                return index
    raise ConversionError(f"pad token {pad!r} is not in the vocabulary", source=str(tokenizer_dir / TOKENIZER_FILE))


def _cleaning_normalizer(clean: str, original: dict[str, Any] | None) -> dict[str, Any]:
    """open_clip's cleaning (`tokenizer.py`: `whitespace_clean`, lower-casing, `canonicalize_text`) as `tokenizers`
    normalizers run before the tokenizer's own: NFC (what ftfy leaves), then for `canonicalize` "_" to a space and
    string.punctuation removed, for `canonicalize` and `lower` lower-casing, and for all three each run of what
    Python's str.split() splits at made one space, the ends stripped."""
    steps: list[dict[str, Any]] = [{"type": "NFC"}]
    if clean == "canonicalize":
        punctuation = "".join(f"\\x{{{ord(char):X}}}" for char in string.punctuation)
        steps.append({"type": "Replace", "pattern": {"String": "_"}, "content": " "})
        steps.append({"type": "Replace", "pattern": {"Regex": f"[{punctuation}]"}, "content": ""})
    if clean in ("canonicalize", "lower"):
        steps.append({"type": "Lowercase"})
    spaces = "".join(f"\\x{{{code:X}}}" for code in range(sys.maxunicode + 1) if chr(code).isspace())
    steps.append({"type": "Replace", "pattern": {"Regex": f"[{spaces}]+"}, "content": " "})
    steps.append({"type": "Strip", "strip_left": True, "strip_right": True})
    if original is not None:
        steps.append(original)
    return {"type": "Sequence", "normalizers": steps}
