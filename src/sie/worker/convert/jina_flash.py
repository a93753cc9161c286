"""Jina's "flash" XLM-RoBERTa checkpoints (remote code `configuration_xlm_roberta.XLMRobertaFlashConfig`:
jina-reranker-v2-base-multilingual) read as the XLM-RoBERTa checkpoints they were made from.

That code is Tri Dao's flash-attention BERT with XLM-R's embeddings: with `position_embedding_type: absolute` it
computes what transformers' XLMRobertaModel computes (positions from the padding index, post-norm blocks, erf GELU,
RoBERTa's classification head on `<s>`), under other tensor names — the embedding LayerNorm as `emb_ln`, each layer's
query, key and value stacked in `mixer.Wqkv`, `mixer.out_proj`, `norm1`, `mlp.fc1`, `mlp.fc2`, `norm2` (Jina's
`convert_roberta_weights_to_flash.py` renames an XLM-R checkpoint so). `FlashXlmRobertaTensors` undoes the renaming,
so the encoder converter builds the family it already builds; its config.json, which names no `model_type`, is read
as `xlm-roberta` (`as_xlm_roberta_config`). The rotary variant of the same code (jina-colbert-v2,
jina-embeddings-v3) and its LoRA adapters are refused by name.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import numpy as np

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.safetensors_io import Checkpoint

FLASH_CONFIG_CLASS = "configuration_xlm_roberta.XLMRobertaFlashConfig"  # auto_map's AutoConfig, after any repo prefix
XLM_ROBERTA = "xlm-roberta"
# Settings of the flash code that change the computation, and the value at which it is XLM-R's.
_PLAIN_SETTINGS: dict[str, Any] = {
    "position_embedding_type": "absolute", "last_layer_subset": False, "fused_mlp": False, "lora_adaptations": None,
    "load_trained_adapters": False, "pad_vocab_size_multiple": 1,
}  # fmt: skip


def is_flash_xlm_roberta(raw: dict[str, Any]) -> bool:
    """Whether a config.json is the flash XLM-RoBERTa remote code's (its auto_map names XLMRobertaFlashConfig)."""
    auto_map = raw.get("auto_map")
    config_class = auto_map.get("AutoConfig") if isinstance(auto_map, dict) else None
    return isinstance(config_class, str) and config_class.split("--")[-1] == FLASH_CONFIG_CLASS


def as_xlm_roberta_config(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The flash config as transformers' XLMRobertaConfig reads it; ConversionError naming a setting under which the
    flash code computes something else (rotary positions, LoRA adapters, the last-layer subset)."""
    for key, plain in _PLAIN_SETTINGS.items():
        value = raw.get(key, plain)
        if value != plain:
            what = " (Jina's rotary XLM-RoBERTa: jina-colbert-v2, jina-embeddings-v3)" if key.startswith("pos") else ""
            raise ConversionError(f"{key} is {value!r}: the flash XLM-RoBERTa is built with {plain!r} only{what}",
                                  source=source)  # fmt: skip
    model_type = raw.get("model_type", XLM_ROBERTA)
    if model_type != XLM_ROBERTA:
        raise ConversionError(f"model_type {model_type!r} with the flash XLM-RoBERTa's config class", source=source)
    return {**raw, "model_type": XLM_ROBERTA}


@attrs.frozen
class RenamedEntry:
    """A tensor's shape and dtype under its XLM-R name."""

    shape: tuple[int, ...]
    dtype: str


_LAYER = re.compile(r"^(?P<prefix>.*)encoder\.layers\.(?P<index>\d+)\.(?P<rest>.+)$")
_LAYER_NAMES = {  # flash name after `encoder.layers.{i}.` → XLM-R's after `encoder.layer.{i}.`
    "mixer.out_proj": "attention.output.dense", "norm1": "attention.output.LayerNorm", "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense", "norm2": "output.LayerNorm",
}  # fmt: skip
_STACKED = ("attention.self.query", "attention.self.key", "attention.self.value")  # mixer.Wqkv's rows, in order


class FlashXlmRobertaTensors:
    """A flash XLM-RoBERTa checkpoint's tensors by transformers' XLM-RoBERTa names (`Checkpoint`'s interface:
    `entries`, `load`, `in`); `mixer.Wqkv` is read as the query, key and value it stacks."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.path = checkpoint.path
        self._checkpoint = checkpoint
        self._stored: dict[str, tuple[str, int | None]] = {}  # XLM-R name → (stored name, part of Wqkv or None)
        self.entries: dict[str, RenamedEntry] = {}
        for stored, entry in checkpoint.entries.items():
            for name, part in _xlm_roberta_names(stored):
                shape = tuple(entry.shape)
                if part is not None:
                    if shape[0] % 3:
                        raise ConversionError(f"has shape {list(shape)}: its first axis does not split in 3 (query, "
                                              "key, value)", source=str(self.path), tensor=stored)  # fmt: skip
                    shape = (shape[0] // 3, *shape[1:])
                self._stored[name] = (stored, part)
                self.entries[name] = RenamedEntry(shape, str(getattr(entry, "dtype", "")))

    def __contains__(self, name: object) -> bool:
        return name in self._stored

    def load(self, name: str) -> np.ndarray:
        if name not in self._stored:
            raise ConversionError("tensor not found", source=str(self.path), tensor=name)
        stored, part = self._stored[name]
        array = self._checkpoint.load(stored)
        if part is None:
            return array
        rows = array.shape[0] // 3
        return np.ascontiguousarray(array[part * rows : (part + 1) * rows])

    def load_rows(self, name: str, rows: list[int]) -> np.ndarray:
        return self.load(name)[rows]


def _xlm_roberta_names(stored: str) -> list[tuple[str, int | None]]:
    """The XLM-R names a stored flash tensor holds, each with its part of a stacked Wqkv (None: the whole tensor)."""
    if stored.endswith("emb_ln.weight") or stored.endswith("emb_ln.bias"):
        return [(stored.replace("emb_ln.", "embeddings.LayerNorm."), None)]
    match = _LAYER.match(stored)
    if match is None:
        return [(stored, None)]
    layer = f"{match['prefix']}encoder.layer.{match['index']}."
    rest = match["rest"]
    kind = rest.rsplit(".", 1)[-1]
    if rest in ("mixer.Wqkv.weight", "mixer.Wqkv.bias"):
        return [(f"{layer}{part}.{kind}", index) for index, part in enumerate(_STACKED)]
    module = rest.rsplit(".", 1)[0]
    if module not in _LAYER_NAMES:
        return [(stored, None)]  # not a tensor of XLM-R: the converter never asks for it
    return [(f"{layer}{_LAYER_NAMES[module]}.{kind}", None)]
