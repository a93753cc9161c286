"""Tiny random open_clip SigLIP checkpoints built and saved as open_clip's Hub repositories hold them (Marqo's
fashion and e-commerce SigLIPs): `open_clip_config.json` in the ViT-B-16-SigLIP shape (a timm SigLIP ViT with
attention pooling, open_clip's bidirectional text tower, `clean: canonicalize`), `open_clip_model.safetensors`, and a
SentencePiece-style Unigram tokenizer trained here, saved by transformers. Width 96, 2 layers, 32-pixel images in
8-pixel patches; every parameter moved off its initial value and `logit_scale` / `logit_bias` set, so a tensor
skipped or swapped shows.

The image tower is timm's VisionTransformer registered under a SigLIP name (`vit_base_patch8_siglip_32`: a "base"
has 12 heads). torch, timm and open_clip are imported when a model is built (`make test` installs open_clip and timm
beside the test extra). They import torchvision, which lives apart in TORCHVISION_DIR, put on sys.path here only: the
index holds torchvision only as a CUDA build, whose C operators cannot load beside the CPU torch (transformers would
fail importing it anywhere else). torchvision still registers fake kernels for two of those operators when imported,
so their schemas are declared first; nothing here calls them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from launcher import REPO

TORCHVISION_VERSION = "0.28.0"  # paired with the test extra's torch 2.13
TORCHVISION_DIR = REPO / ".cache" / f"torchvision-{TORCHVISION_VERSION}"  # the Makefile's TORCHVISION_DIR
TIMM_NAME = "vit_base_patch8_siglip_32"
WIDTH, IMAGE_SIZE, CONTEXT, VOCAB = 96, 32, 16, 240
LOGIT_SCALE, LOGIT_BIAS = 2.5, -7.0
PREPROCESS = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bicubic", "resize_mode": "squash"}
CORPUS = [
    "a red dress with long sleeves", "Red Dress, size M!", "men's slim-fit jeans in dark blue", "leather ankle boots",
    "a white cotton t-shirt", "summer sandals for women", "UPPER case and lower case words", "café au lait mug",
    "wool winter coat with a hood", "running shoes: lightweight & breathable", "silk scarf (floral print)",
    "kids_rain_jacket yellow", "black handbag with gold chain", "denim shorts 100% cotton", "knitted beanie hat",
]  # fmt: skip


def model_cfg(tokenizer_name: str = "timm/ViT-B-16-SigLIP", clean: str = "canonicalize") -> dict[str, Any]:
    """ViT-B-16-SigLIP's open_clip model_cfg at the tiny size."""
    return {
        "embed_dim": WIDTH, "init_logit_bias": -10, "custom_text": True,
        "vision_cfg": {"image_size": IMAGE_SIZE, "timm_model_name": TIMM_NAME, "timm_model_pretrained": False,
                       "timm_pool": "map", "timm_proj": "none"},
        "text_cfg": {"context_length": CONTEXT, "vocab_size": VOCAB, "hf_tokenizer_name": tokenizer_name,
                     "tokenizer_kwargs": {"clean": clean}, "width": WIDTH, "heads": 4, "layers": 2,
                     "no_causal_mask": True, "proj_bias": True, "pool_type": "last", "norm_kwargs": {"eps": 1e-6}},
    }  # fmt: skip


@cache
def open_clip_module() -> Any:
    """open_clip, imported with torchvision's two fake-kernel schemas declared and the tiny timm ViT registered."""
    import torch

    if not TORCHVISION_DIR.is_dir():  # a bare pytest run: what `make test` installs
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(TORCHVISION_DIR)]
        subprocess.run([*command, f"torchvision=={TORCHVISION_VERSION}"], check=True, timeout=900)
    if str(TORCHVISION_DIR) not in sys.path:
        sys.path.append(str(TORCHVISION_DIR))
    if not hasattr(torch.ops.torchvision, "nms"):
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARIES.append(library)  # a Library unregisters its schemas when collected
    import open_clip
    from timm.models import register_model
    from timm.models.vision_transformer import _create_vision_transformer

    def tiny_siglip_vit(pretrained: bool = False, **kwargs: Any) -> Any:
        shape = {"patch_size": 8, "embed_dim": WIDTH, "depth": 2, "num_heads": 12, "class_token": False,
                 "global_pool": "map", "img_size": IMAGE_SIZE}  # fmt: skip
        return _create_vision_transformer(TIMM_NAME, pretrained=pretrained, **{**shape, **kwargs})

    tiny_siglip_vit.__name__ = TIMM_NAME
    register_model(tiny_siglip_vit)
    return open_clip


_LIBRARIES: list[Any] = []


def write_tokenizer(directory: Path) -> None:
    """A Unigram tokenizer with SigLIP's layout (`<pad>`, `</s>`, `<unk>` first; Metaspace words; `</s>` appended),
    trained on CORPUS with its capitals and punctuation, saved by transformers as a fast tokenizer."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>", model_max_length=CONTEXT)  # fmt: skip
    fast.save_pretrained(directory)


def save_open_clip_siglip(directory: Path, seed: int = 0, clean: str = "canonicalize") -> None:
    """A random open_clip SigLIP in `directory` as its Hub repository holds it (config, weights, tokenizer)."""
    import torch
    from safetensors.torch import save_file

    open_clip = open_clip_module()
    directory.mkdir(parents=True, exist_ok=True)
    write_tokenizer(directory)
    config = {"model_cfg": model_cfg(clean=clean), "preprocess_cfg": PREPROCESS}
    (directory / "open_clip_config.json").write_text(json.dumps(config, indent=2))
    name = f"sie-tiny-siglip-{clean}"
    registered = directory / f"{name}.json"
    registered.write_text(json.dumps(model_cfg(clean=clean)))
    open_clip.add_model_config(registered)
    registered.unlink()
    model = open_clip.create_model(name, pretrained=None)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name == "logit_scale":
                parameter.fill_(LOGIT_SCALE)
            elif parameter_name == "logit_bias":
                parameter.fill_(LOGIT_BIAS)
            else:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    state = {key: value.contiguous() for key, value in model.state_dict().items()}
    save_file(state, str(directory / "open_clip_model.safetensors"))


def load_reference(directory: Path) -> tuple[Any, Any, Any]:
    """(model, eval transform, tokenizer) as open_clip loads `directory` itself (`local-dir:`), in eval mode."""
    open_clip = open_clip_module()
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{directory}")
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(f"local-dir:{directory}")


# The catalogue id the shared e2e cluster serves `save_open_clip_siglip`'s checkpoint under.
TINY_OPEN_CLIP = "tiny/open-clip-siglip"


def open_clip_yaml(sie_id: str, weights: Path) -> dict[str, Any]:
    """A model YAML in the shape of the public catalogue's Marqo SigLIPs (`backend: open_clip`, normalised vectors)
    for a `save_open_clip_siglip` checkpoint."""
    return {
        "sie_id": sie_id, "weights_path": str(weights), "max_sequence_length": CONTEXT,
        "inputs": {"text": True, "image": True}, "tasks": {"encode": {"dense": {"dim": WIDTH}}},
        "profiles": {"default": {
            "adapter_path": "sie_server.adapters.siglip.adapter:SiglipAdapter", "max_batch_tokens": 16384,
            "compute_precision": "float16",
            "adapter_options": {
                "loadtime": {"backend": "open_clip", "open_clip_model_id": "hf-hub:Marqo/marqo-fashionSigLIP",
                             "dense_dim": WIDTH},
                "runtime": {"normalize": True},
            },
        }},
    }  # fmt: skip
