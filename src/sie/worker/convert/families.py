"""The encoder families built like BERT (post-LayerNorm transformer layers over learned absolute positions): what
tells them apart, as data. `EncoderConfig` is the architecture read from a Hugging Face `config.json`, checked for
what the graph builder cannot do; `EncoderFamily` says where each family keeps its tensors and which task heads it
carries.

- bert (bert): the reference layout.
- roberta (roberta, xlm-roberta, camembert): positions counted from `pad_token_id + 1` over the ids that are not
  padding; one token type; classifier `dense`-tanh-`out_proj` on the first token; MLM head `lm_head`.
- electra (electra): embeddings of `embedding_size` projected to the hidden size (`embeddings_project`); classifier
  `dense`-gelu-`out_proj`; no MLM head (its MLM is the separate generator).
- distilbert (distilbert): no token types; its own tensor and config names; classifier
  `pre_classifier`-relu-`classifier`; MLM head `vocab_*`.
- mpnet (mpnet): RoBERTa's positions (padding id 1, fixed in its modeling code) and heads, no token types, attention
  names `attention.attn.{q,k,v,o}`, and a learned bias per head for each query-key distance bucket
  (`encoder.relative_attention_bias`, T5-style buckets: 32, up to a distance of 128), added to every layer's scores.
- jina_bert (JinaBERT v2: `model_type: bert` with `position_embedding_type: alibi`, remote code
  `jinaai/jina-bert-implementation`): no learned positions but ALiBi, a bias of `-slope[head] * |query - key|` on
  every layer's scores (slopes as in the ALiBi paper, interleaved for a head count that is not a power of two); a
  gated feed-forward (`feed_forward_type` geglu or reglu): `mlp.gated_layers` (no bias) gives the gated half first,
  its GELU (ReLU) times the other half goes through `mlp.wo`, then residual and `mlp.layernorm`.

Each entry was read from the family's `modeling_*.py` in transformers and is checked against transformers itself on a
random checkpoint (tests/unit/test_convert_families.py); JinaBERT, whose code is not in transformers, against a numpy
reference of its modeling code (tests/unit/test_convert_jina.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.jina_flash import as_known_config, is_flash_xlm_roberta
from sie.worker.convert.safetensors_io import read_json

# Hugging Face's "gelu" is the exact erf form; the tanh approximations are different functions.
SUPPORTED_ACTIVATIONS = frozenset({"gelu"})
# JinaBERT's feed-forward types -> the activation of the gated half ("" for BERT's own feed-forward).
JINA_FEED_FORWARD = {"original": "", "geglu": "gelu", "reglu": "relu"}
# MPNet's modeling code fixes its padding id at 1 and computes 32 distance buckets whatever its config says (the
# table has relative_attention_num_buckets rows).
MPNET_PADDING_IDX = 1
MPNET_BUCKETS = 32


@attrs.frozen
class MlmHead:
    """Where a family keeps its masked-language-model head: dense, GELU, LayerNorm, then a decoder that is the
    word-embedding table unless the checkpoint stores a different one, plus a bias (one of `biases`)."""

    dense: str
    norm: str
    decoder: str
    biases: tuple[str, ...]
    word_embeddings: str = "embeddings.word_embeddings.weight"  # the table a tied decoder shares


@attrs.frozen
class EncoderFamily:
    """Tensor names of one family, relative to its base-model prefix (`bert.`, `roberta.`, ...) for the encoder and
    absolute for the task heads, as transformers saves them."""

    name: str
    model_types: tuple[str, ...]
    prefix: str
    layer: str  # "{index}" is the layer number
    query: str
    key: str
    value: str
    attention_output: str
    attention_norm: str
    ffn_in: str
    ffn_out: str
    ffn_norm: str
    # "pooler" (BERT: pooler dense + tanh, then `classifier`), "tanh" / "gelu" (`classifier.dense`, the activation,
    # `classifier.out_proj`), "relu" (DistilBERT: `pre_classifier`, relu, `classifier`), "deberta", "modernbert",
    # "bart" (the decoder's state at the last <eos>, `classification_head`)
    sequence_classifier: str
    mlm: MlmHead | None
    # MPNet: the [buckets, heads] table of a relative position bias shared by every layer ("" for none)
    relative_attention_bias: str = ""


_BERT_LAYER = {
    "layer": "encoder.layer.{index}",
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_output": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}

# RoBERTa's and MPNet's masked-LM head.
_LM_HEAD = MlmHead(
    "lm_head.dense", "lm_head.layer_norm", "lm_head.decoder.weight", ("lm_head.bias", "lm_head.decoder.bias")
)
_BERT_MLM = MlmHead(
    "cls.predictions.transform.dense",
    "cls.predictions.transform.LayerNorm",
    "cls.predictions.decoder.weight",
    ("cls.predictions.bias", "cls.predictions.decoder.bias"),
)
# JinaBERT v2: BERT's names, but its gated feed-forward's own. Chosen by the config (model_type is "bert").
JINA_BERT = EncoderFamily(
    "jina_bert",
    (),
    "bert.",
    **_BERT_LAYER | {"ffn_in": "mlp.gated_layers", "ffn_out": "mlp.wo", "ffn_norm": "mlp.layernorm"},
    sequence_classifier="pooler",
    mlm=_BERT_MLM,
)

FAMILIES: Mapping[str, EncoderFamily] = MappingProxyType(
    {
        family.name: family
        for family in (
            EncoderFamily("bert", ("bert",), "bert.", **_BERT_LAYER, sequence_classifier="pooler", mlm=_BERT_MLM),
            EncoderFamily(
                "roberta",
                ("roberta", "xlm-roberta", "camembert"),
                "roberta.",
                **_BERT_LAYER,
                sequence_classifier="tanh",
                mlm=_LM_HEAD,
            ),
            EncoderFamily("electra", ("electra",), "electra.", **_BERT_LAYER, sequence_classifier="gelu", mlm=None),
            EncoderFamily(
                "distilbert",
                ("distilbert",),
                "distilbert.",
                layer="transformer.layer.{index}",
                query="attention.q_lin",
                key="attention.k_lin",
                value="attention.v_lin",
                attention_output="attention.out_lin",
                attention_norm="sa_layer_norm",
                ffn_in="ffn.lin1",
                ffn_out="ffn.lin2",
                ffn_norm="output_layer_norm",
                sequence_classifier="relu",
                mlm=MlmHead("vocab_transform", "vocab_layer_norm", "vocab_projector.weight", ("vocab_projector.bias",)),
            ),
            EncoderFamily(
                "mpnet",
                ("mpnet",),
                "mpnet.",
                layer="encoder.layer.{index}",
                query="attention.attn.q",
                key="attention.attn.k",
                value="attention.attn.v",
                attention_output="attention.attn.o",
                attention_norm="attention.LayerNorm",
                ffn_in="intermediate.dense",
                ffn_out="output.dense",
                ffn_norm="output.LayerNorm",
                sequence_classifier="tanh",
                mlm=_LM_HEAD,
                relative_attention_bias="encoder.relative_attention_bias.weight",
            ),
            JINA_BERT,
        )  # fmt: skip
    }
)
FAMILY_OF_MODEL_TYPE: Mapping[str, EncoderFamily] = MappingProxyType(
    {model_type: family for family in FAMILIES.values() for model_type in family.model_types}
)
# Encoder families with a graph of their own (`modernbert.py`, `rotary_glu.py`: GTE "new", NomicBERT; `deberta.py`;
# `bart.py`: BART's sequence classifier), beside the BERT-like ones above.
OWN_GRAPH_MODEL_TYPES = ("modernbert", "new", "gte", "nomic_bert", "deberta-v2", "bart")
CONVERTED_MODEL_TYPES = tuple(sorted([*FAMILY_OF_MODEL_TYPE, *OWN_GRAPH_MODEL_TYPES]))


@attrs.frozen
class EncoderShape:
    """The numbers every encoder family's graph and heads are sized by."""

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int
    vocab_size: int

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


@attrs.frozen
class EncoderConfig(EncoderShape):
    """The architecture of one checkpoint of a BERT-like family, plus its label names in id order."""

    family: EncoderFamily
    type_vocab_size: int = 2  # 0: the family has no token-type embeddings
    embedding_size: int = 0  # the embeddings' width where it differs from hidden_size (ELECTRA), else 0
    # RoBERTa's positions: padding tokens sit at position `padding_idx`, real tokens count up from padding_idx + 1.
    padding_idx: int | None = None
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    labels: tuple[str, ...] = ()
    relative_attention_buckets: int = 0  # rows of MPNet's relative position bias table; 0: no such bias
    alibi: bool = False  # JinaBERT: ALiBi distance biases instead of learned positions
    gated_activation: str = ""  # JinaBERT: the activation of its gated feed-forward ("" for BERT's own)
    # Whether the task heads' Linear and LayerNorm layers carry biases (ModernBERT's may not; these families' do).
    classifier_bias: bool = True
    norm_bias: bool = True
    decoder_bias: bool = True

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size


def position_capacity(raw: dict[str, Any]) -> int | None:
    """The most tokens one sequence of this checkpoint can hold (its learned positions; RoBERTa's start after
    `pad_token_id`), or None when the config does not say (not one of these families, or no position count)."""
    if is_flash_xlm_roberta(raw):  # Jina's remote-code XLM-R: the positions of the family it is read as
        try:
            raw = as_known_config(raw, "config.json")
        except ConversionError:
            return None
    family = FAMILY_OF_MODEL_TYPE.get(raw.get("model_type"))  # type: ignore[arg-type]
    positions = raw.get("n_positions" if raw.get("model_type") == "nomic_bert" else "max_position_embeddings")
    if not isinstance(positions, int) or isinstance(positions, bool):
        return None
    if raw.get("model_type") in OWN_GRAPH_MODEL_TYPES:
        return positions  # rotary positions: the context it was trained for (NomicBERT's `n_positions`)
    if family is None:
        return None
    if family.name == "roberta":
        pad = raw.get("pad_token_id", 1)
        return positions - pad - 1 if isinstance(pad, int) else None
    # ALiBi (JinaBERT) has no position table: its config's count is the context it was trained for, as here.
    if family.name == "mpnet":
        return positions - MPNET_PADDING_IDX - 1
    return positions


def load_encoder_config(path: Path) -> EncoderConfig:
    """Read and validate `config.json`; errors name the file and the field."""
    return parse_encoder_config(read_config_json(path), source=str(path))


def read_config_json(path: Path) -> dict[str, Any]:
    """The decoded `config.json`; errors name the file."""
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ConversionError("top level is not a JSON object", source=str(path))
    return raw


def parse_encoder_config(raw: dict[str, Any], *, source: str = "config.json") -> EncoderConfig:
    """Build an `EncoderConfig` from the decoded JSON object; an unknown `model_type` names the supported ones."""
    model_type = raw.get("model_type")
    family = FAMILY_OF_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ConversionError(
            f"model_type {model_type!r} is not an encoder family this converter builds "
            f"(supported: {', '.join(CONVERTED_MODEL_TYPES)})",
            source=source,
        )
    if family.name == "distilbert":
        return _distilbert_config(raw, family, source)
    act = raw.get("hidden_act", "gelu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ConversionError(f"hidden_act {act!r} is not supported (only erf 'gelu')", source=source)
    position_type = raw.get("position_embedding_type", "absolute")
    alibi = position_type == "alibi" and family.name == "bert"
    if position_type != "absolute" and not alibi:
        raise ConversionError(
            f"position_embedding_type {position_type!r} is not 'absolute' (or 'alibi' for JinaBERT)", source=source
        )
    gated = ""
    if alibi:
        feed_forward = raw.get("feed_forward_type", "original")
        if feed_forward not in JINA_FEED_FORWARD:
            raise ConversionError(
                f"feed_forward_type {feed_forward!r} is not one of {sorted(JINA_FEED_FORWARD)}", source=source
            )
        gated = JINA_FEED_FORWARD[feed_forward]
        family = JINA_BERT if gated else family
    numbers = shape_numbers(raw, source)
    embedding_size = positive_int(raw, "embedding_size", source) if raw.get("embedding_size") is not None else 0
    padding_idx, types, buckets = _positions(raw, family, source)
    return EncoderConfig(
        family=family,
        **numbers,
        type_vocab_size=types,
        relative_attention_buckets=buckets,
        embedding_size=0 if embedding_size == numbers["hidden_size"] else embedding_size,
        padding_idx=padding_idx,
        layer_norm_eps=positive_float(raw, "layer_norm_eps", 1e-12, source),
        hidden_act=act,
        labels=labels_of(raw.get("id2label"), source),
        alibi=alibi,
        gated_activation=gated,
    )


def _positions(raw: dict[str, Any], family: EncoderFamily, source: str) -> tuple[int | None, int, int]:
    """`(padding_idx, type_vocab_size, relative_attention_buckets)`: how the family places tokens."""
    if family.name == "mpnet":
        buckets = raw.get("relative_attention_num_buckets", MPNET_BUCKETS)
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < MPNET_BUCKETS:
            raise ConversionError(f"relative_attention_num_buckets {buckets!r} is under {MPNET_BUCKETS}", source=source)
        return MPNET_PADDING_IDX, 0, buckets
    types = positive_int(raw, "type_vocab_size", source) if "type_vocab_size" in raw else 2
    if family.name != "roberta":
        return None, types, 0
    padding_idx = raw.get("pad_token_id", 1)
    if not isinstance(padding_idx, int) or isinstance(padding_idx, bool) or padding_idx < 0:
        raise ConversionError(f"pad_token_id {padding_idx!r} is not a non-negative integer", source=source)
    return padding_idx, types, 0


def shape_numbers(raw: dict[str, Any], source: str) -> dict[str, int]:
    """The `EncoderShape` fields of a config that names them as BERT does, checked."""
    numbers = {
        key: positive_int(raw, key, source)
        for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                    "max_position_embeddings", "vocab_size")
    }  # fmt: skip
    check_heads(numbers["hidden_size"], numbers["num_attention_heads"], source)
    return numbers


def _distilbert_config(raw: dict[str, Any], family: EncoderFamily, source: str) -> EncoderConfig:
    act = raw.get("activation", "gelu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ConversionError(f"activation {act!r} is not supported (only erf 'gelu')", source=source)
    hidden, heads = positive_int(raw, "dim", source), positive_int(raw, "n_heads", source)
    check_heads(hidden, heads, source)
    return EncoderConfig(
        family=family,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=positive_int(raw, "n_layers", source),
        intermediate_size=positive_int(raw, "hidden_dim", source),
        max_position_embeddings=positive_int(raw, "max_position_embeddings", source),
        vocab_size=positive_int(raw, "vocab_size", source),
        type_vocab_size=0,
        layer_norm_eps=1e-12,  # fixed in DistilBERT's modeling code
        hidden_act=act,
        labels=labels_of(raw.get("id2label"), source),
    )


def check_heads(hidden: int, heads: int, source: str) -> None:
    if hidden % heads:
        raise ConversionError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}", source=source)


def positive_int(raw: dict[str, Any], key: str, source: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConversionError(f"{key} {value!r} is missing or not a positive integer", source=source)
    return value


def positive_float(raw: dict[str, Any], key: str, default: float | None, source: str) -> float:
    value = raw.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ConversionError(f"{key} {value!r} is not a positive number", source=source)
    return float(value)


def labels_of(id2label: Any, source: str) -> tuple[str, ...]:
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
