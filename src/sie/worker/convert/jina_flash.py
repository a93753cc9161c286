"""Jina's "flash" XLM-RoBERTa checkpoints (remote code `configuration_xlm_roberta.XLMRobertaFlashConfig`:
jina-reranker-v2-base-multilingual, jina-colbert-v2) read as the families the converter already builds.

That code is Tri Dao's flash-attention BERT with XLM-R's embeddings and post-norm blocks, its tensors named as Jina's
`convert_roberta_weights_to_flash.py` renames an XLM-R checkpoint: the embedding LayerNorm `emb_ln`, each layer's
query, key and value stacked in `mixer.Wqkv`, then `mixer.out_proj`, `norm1`, `mlp.fc1`, `mlp.fc2`, `norm2`.

- With `position_embedding_type: absolute` (jina-reranker-v2) it computes what transformers' XLMRobertaModel computes
  (positions from the padding index, erf GELU, RoBERTa's classification head on `<s>`): the config is read as
  `xlm-roberta` and the tensors by XLM-R's names (Wqkv split into query, key and value).
- With `rotary` (jina-colbert-v2; the public SIE adapter recomputes it the same way) there is no position table: q
  and k are rotated (rotate-half over the whole head, positions from 0, base `rotary_emb_base`) — NomicBERT's
  layer with a plain GELU MLP (`rotary_glu.py`), so the config is read as that and the tensors by its names
  (`mixer.` as `attn.`, under `bert.`).

A config.json names no `model_type` or `xlm-roberta`; `as_known_config` gives the one the families read. LoRA
adapters (jina-embeddings-v3's task adapters) and the other settings under which the code computes something else
are refused by name.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import numpy as np

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.safetensors_io import Checkpoint

FLASH_CONFIG_CLASS = "configuration_xlm_roberta.XLMRobertaFlashConfig"  # auto_map's AutoConfig, after any repo prefix
XLM_ROBERTA, NOMIC_BERT = "xlm-roberta", "nomic_bert"
POSITION_KINDS = ("absolute", "rotary")
# Settings of the flash code that change the computation, and the value at which it is what is built.
_PLAIN_SETTINGS: dict[str, Any] = {
    "last_layer_subset": False, "fused_mlp": False, "lora_adaptations": None, "load_trained_adapters": False,
    "pad_vocab_size_multiple": 1, "rotary_emb_interleaved": False, "rotary_emb_fraction": 1.0,
}  # fmt: skip
_ACTIVATIONS = {"gelu": "gelu"}  # hidden_act → NomicBERT's activation_function (the erf GELU of `create_mlp_cls`)


def is_flash_xlm_roberta(raw: dict[str, Any]) -> bool:
    """Whether a config.json is the flash XLM-RoBERTa remote code's (its auto_map names XLMRobertaFlashConfig)."""
    auto_map = raw.get("auto_map")
    config_class = auto_map.get("AutoConfig") if isinstance(auto_map, dict) else None
    return isinstance(config_class, str) and config_class.split("--")[-1] == FLASH_CONFIG_CLASS


def is_rotary(raw: dict[str, Any]) -> bool:
    return raw.get("position_embedding_type", "absolute") == "rotary"


def as_known_config(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The flash config as the family it computes reads it (XLM-R's config, or NomicBERT's for rotary positions);
    ConversionError naming a setting under which the flash code computes something else."""
    for key, plain in _PLAIN_SETTINGS.items():
        value = raw.get(key) if raw.get(key) is not None else plain
        if value != plain and not (key == "lora_adaptations" and value == []):
            raise ConversionError(f"{key} is {value!r}: the flash XLM-RoBERTa is built with {plain!r} only",
                                  source=source)  # fmt: skip
    kind = raw.get("position_embedding_type", "absolute")
    if kind not in POSITION_KINDS:
        raise ConversionError(f"position_embedding_type is {kind!r}: expected one of {', '.join(POSITION_KINDS)}",
                              source=source)  # fmt: skip
    model_type = raw.get("model_type", XLM_ROBERTA)
    if model_type != XLM_ROBERTA:
        raise ConversionError(f"model_type {model_type!r} with the flash XLM-RoBERTa's config class", source=source)
    if kind == "absolute":
        return {**raw, "model_type": XLM_ROBERTA}
    activation = raw.get("hidden_act", "gelu")
    if activation not in _ACTIVATIONS:
        raise ConversionError(f"hidden_act {activation!r} is not built with rotary positions (only 'gelu')",
                              source=source)  # fmt: skip
    return {
        "model_type": NOMIC_BERT, "n_embd": raw.get("hidden_size"), "n_head": raw.get("num_attention_heads"),
        "n_inner": raw.get("intermediate_size"), "n_layer": raw.get("num_hidden_layers"),
        "n_positions": raw.get("max_position_embeddings"), "vocab_size": raw.get("vocab_size"),
        "type_vocab_size": raw.get("type_vocab_size", 2), "layer_norm_epsilon": raw.get("layer_norm_eps", 1e-12),
        "rotary_emb_base": raw.get("rotary_emb_base", 10_000.0), "rotary_emb_fraction": 1.0,
        "activation_function": _ACTIVATIONS[activation], "qkv_proj_bias": True, "mlp_fc1_bias": True,
        "mlp_fc2_bias": True, "prenorm": False, "pad_token_id": raw.get("pad_token_id"),
        "id2label": raw.get("id2label"),
    }  # fmt: skip


@attrs.frozen
class RenamedEntry:
    """A tensor's shape and dtype under the name the converter reads it by."""

    shape: tuple[int, ...]
    dtype: str


_LAYER = re.compile(r"^(?P<prefix>.*)encoder\.layers\.(?P<index>\d+)\.(?P<rest>.+)$")
_XLM_R_LAYER = {  # flash name after `encoder.layers.{i}.` → XLM-R's after `encoder.layer.{i}.`
    "mixer.out_proj": "attention.output.dense", "norm1": "attention.output.LayerNorm", "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense", "norm2": "output.LayerNorm",
}  # fmt: skip
_XLM_R_STACKED = ("attention.self.query", "attention.self.key", "attention.self.value")  # mixer.Wqkv's rows, in order


class FlashXlmRobertaTensors:
    """A flash XLM-RoBERTa checkpoint's tensors by the names of the family it is read as (`Checkpoint`'s interface:
    `entries`, `load`, `in`): XLM-R's, `mixer.Wqkv` read as the query, key and value it stacks; or, for rotary
    positions, NomicBERT's. Tensors outside the encoder (a classifier, ColBERT's `linear`) keep their names."""

    def __init__(self, checkpoint: Checkpoint, rotary: bool = False) -> None:
        self.path = checkpoint.path
        self._checkpoint = checkpoint
        self._stored: dict[str, tuple[str, int | None]] = {}  # read name → (stored name, part of Wqkv or None)
        self.entries: dict[str, RenamedEntry] = {}
        for stored, entry in checkpoint.entries.items():
            for name, part in _nomic_names(stored) if rotary else _xlm_roberta_names(stored):
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
        return [(f"{layer}{part}.{kind}", index) for index, part in enumerate(_XLM_R_STACKED)]
    module = rest.rsplit(".", 1)[0]
    if module not in _XLM_R_LAYER:
        return [(stored, None)]  # not a tensor of XLM-R: the converter never asks for it
    return [(f"{layer}{_XLM_R_LAYER[module]}.{kind}", None)]


def _nomic_names(stored: str) -> list[tuple[str, int | None]]:
    """NomicBERT's name for a stored flash tensor: `roberta.` as `bert.`, `mixer.` as `attn.`."""
    if not stored.startswith("roberta."):
        return [(stored, None)]
    name = "bert." + stored.removeprefix("roberta.")
    return [(re.sub(r"^(bert\.encoder\.layers\.\d+)\.mixer\.", r"\1.attn.", name), None)]
