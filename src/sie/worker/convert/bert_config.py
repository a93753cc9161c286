"""`BertConfig`: the fields of a Hugging Face BERT `config.json` that shape the converted graph.

It validates what the graph builder cannot handle (non-BERT model types, non-erf activations,
relative position embeddings) and never reads weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from sie.worker.convert.errors import ConversionError

SUPPORTED_MODEL_TYPES = frozenset({"bert"})
# Hugging Face's "gelu" is the exact erf form; the tanh approximations are different functions.
SUPPORTED_ACTIVATIONS = frozenset({"gelu"})
_REQUIRED_INTS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
)


@attrs.frozen
class BertConfig:
    """The architecture numbers of one BERT checkpoint, plus its label names in id order."""

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    labels: tuple[str, ...] = ()

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


def load_bert_config(path: Path) -> BertConfig:
    """Read and validate `config.json`; errors name the file and the field."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConversionError(f"cannot read file: {exc}", source=str(path)) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"not valid JSON: {exc}", source=str(path)) from exc
    if not isinstance(raw, dict):
        raise ConversionError("top level is not a JSON object", source=str(path))
    return parse_bert_config(raw, source=str(path))


def parse_bert_config(raw: dict[str, Any], *, source: str = "config.json") -> BertConfig:
    """Build a `BertConfig` from the decoded JSON object."""
    _check_architecture(raw, source)
    numbers = {key: _positive_int(raw, key, source) for key in _REQUIRED_INTS}
    if numbers["hidden_size"] % numbers["num_attention_heads"]:
        raise ConversionError(
            f"hidden_size {numbers['hidden_size']} is not a multiple of "
            f"num_attention_heads {numbers['num_attention_heads']}",
            source=source,
        )
    eps = raw.get("layer_norm_eps", 1e-12)
    if not isinstance(eps, int | float) or isinstance(eps, bool) or eps <= 0:
        raise ConversionError(f"layer_norm_eps {eps!r} is not a positive number", source=source)
    type_vocab = _positive_int(raw, "type_vocab_size", source) if "type_vocab_size" in raw else 2
    return BertConfig(
        **numbers,
        type_vocab_size=type_vocab,
        layer_norm_eps=float(eps),
        hidden_act=raw.get("hidden_act", "gelu"),
        labels=_labels(raw.get("id2label"), source),
    )


def _check_architecture(raw: dict[str, Any], source: str) -> None:
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(f"model_type {model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}", source=source)
    act = raw.get("hidden_act", "gelu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ConversionError(f"hidden_act {act!r} is not supported (only erf 'gelu')", source=source)
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ConversionError(f"position_embedding_type {position_type!r} is not 'absolute'", source=source)


def _positive_int(raw: dict[str, Any], key: str, source: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConversionError(f"{key} {value!r} is missing or not a positive integer", source=source)
    return value


def _labels(id2label: Any, source: str) -> tuple[str, ...]:
    if id2label is None:
        return ()
    if not isinstance(id2label, dict):
        raise ConversionError(f"id2label {id2label!r} is not an object", source=source)
    try:
        by_id = {int(key): str(value) for key, value in id2label.items()}
    except ValueError as exc:
        raise ConversionError(f"id2label has a non-integer key: {exc}", source=source) from exc
    if sorted(by_id) != list(range(len(by_id))):
        raise ConversionError(f"id2label ids {sorted(by_id)} are not 0..{len(by_id) - 1}", source=source)
    return tuple(by_id[index] for index in range(len(by_id)))
