"""GLiNER span models (uni-encoder, `markerV0` spans), config + graph: the checkpoint's backbone encoder (DeBERTa-v2/v3,
BERT-like, ModernBERT: any family `encoders.py` builds) reads the label prompt and the text together; the hidden
states are projected to GLiNER's width, each text word is its first subtoken, each label its `<<ENT>>` marker; a
bidirectional LSTM runs over the words; every span of up to `max_width` words is the projected start word and end
word, concatenated and projected again; its score against a label is the dot product with the label's projected
marker, through a sigmoid.

Read from the `gliner` package (`modeling/base.py` UniEncoderSpanModel, `span_rep.py` SpanMarkerV0, `layers.py`) and
checked against it on random checkpoints (tests/integration/test_gliner.py). The graph takes, beside the backbone's
inputs, the positions the adapter found while building the prompt (`names.WORD_POSITIONS`, `WORD_COUNTS`,
`LABEL_POSITIONS`), so label sets may differ from row to row of one batch. A relation-extraction model
(`relations_layer` set) also reads its relation types' markers (`RELATION_POSITIONS`), puts out the words' and the
relation types' embeddings, and has a relation graph beside it (`gliner_relations.py`). Other GLiNER architectures
(label decoders, post-fusion, other span modes, token-level relation models) fail the conversion naming what they
are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import EncoderWeights, graph_inputs
from sie.worker.convert.encoders import BackboneConfig, build_backbone, parse_backbone_config
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import read_config_json
from sie.worker.convert.gliner_relations import check_relations_layer, convert_relations
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
from sie.worker.convert.head_layers import (
    HeadWeights,
    bidirectional_lstm,
    gather_rows,
    linear,
    marker_span_logits,
    projection_mlp,
)
from sie.worker.convert.names import (
    GLINER_BI_SPAN_MODEL_TYPE,
    GLINER_CONFIG_FILE,
    GLINER_RELEX_MODEL_TYPE,
    GLINER_SPAN_MODEL_TYPE,
    GLINER_TOKEN_MODEL_TYPE,
    LABEL_EMBEDDINGS,
    LABEL_POSITIONS,
    RELATION_EMBEDDINGS,
    RELATION_POSITIONS,
    SPAN_SCORES,
    TOKEN_SCORES,
    WORD_COUNTS,
    WORD_EMBEDDINGS,
    WORD_POSITIONS,
    labels_graph_path,
    relations_graph_path,
)
from sie.worker.convert.safetensors_io import Checkpoint, CheckpointPart

BACKBONE_PREFIX = "token_rep_layer.bert_layer.model."
LABELS_ENCODER_PREFIX = "token_rep_layer.labels_encoder.model."
SPAN_MODES = ("markerV0", "token_level")
# `model_type`s of the GLiNER architectures this graph builds (older checkpoints name none).
BUILT_MODEL_TYPES = (None, GLINER_SPAN_MODEL_TYPE, GLINER_BI_SPAN_MODEL_TYPE, GLINER_TOKEN_MODEL_TYPE,
                     GLINER_RELEX_MODEL_TYPE)  # fmt: skip
# What other GLiNER architectures set, and what they are, for the refusal.
_OTHER_ARCHITECTURES = {
    "labels_decoder": "a GLiNER with a label decoder",
    "post_fusion_schema": "a GLiNER with post-fusion layers",
    "span_encoder_config": "a GLiNER with a span context encoder",
    "fuse_layers": "a GLiNER fusing several encoder layers",
}
_FLOAT = TensorProto.FLOAT


@attrs.frozen
class GlinerConfig:
    """The parts of `gliner_config.json` the graph reads (the prompt's markers and window are the adapter's:
    `adapters.gliner.PromptSettings`)."""

    backbone: BackboneConfig
    hidden_size: int
    max_width: int
    rnn_layers: int
    # A bi-encoder's label encoder (labels read on their own, mean-pooled); None: labels are read with the text.
    labels_encoder: BackboneConfig | None = None
    # A token-level model: start, end and inside scores per word and label instead of span scores.
    token_level: bool = False
    # A relation-extraction model's relations layer (`gliner_relations.RELATIONS_LAYERS`); None: entities only.
    relations_layer: str | None = None


def load_gliner_config(model_dir: Path) -> GlinerConfig:
    """Read and validate `gliner_config.json`; errors name the file and the field."""
    path = Path(model_dir) / GLINER_CONFIG_FILE
    return parse_gliner_config(read_config_json(path), str(path))


def parse_gliner_config(raw: dict[str, Any], source: str) -> GlinerConfig:
    _check_built(raw, source)
    backbone = raw.get("encoder_config")
    if not isinstance(backbone, dict):
        raise ConversionError(
            f"no encoder_config: the backbone's config ({raw.get('model_name')!r}) is not saved with the checkpoint",
            source=source,
        )
    backbone = dict(backbone)
    backbone.setdefault("model_type", "deberta-v2")
    labels_encoder = None
    if raw.get("labels_encoder"):
        labels_config = raw.get("labels_encoder_config")
        if not isinstance(labels_config, dict):
            raise ConversionError(
                f"no labels_encoder_config: the label encoder's config ({raw['labels_encoder']!r}) is not saved with "
                "the checkpoint",
                source=source,
            )
        labels_encoder = parse_backbone_config(dict(labels_config), f"{source} labels_encoder_config")
    return GlinerConfig(
        backbone=parse_backbone_config(backbone, f"{source} encoder_config"),
        hidden_size=_positive(raw, "hidden_size", 512, source),
        max_width=_positive(raw, "max_width", 12, source),
        rnn_layers=max(0, int(raw.get("num_rnn_layers", 1))),
        labels_encoder=labels_encoder,
        token_level=raw.get("span_mode") == "token_level",
        relations_layer=(
            check_relations_layer(raw["relations_layer"], raw.get("triples_layer"), source)
            if raw.get("relations_layer") is not None
            else None
        ),
    )


def _check_built(raw: dict[str, Any], source: str) -> None:
    """Refuse, naming it, what the graph does not build."""
    model_type = raw.get("model_type")
    if model_type not in BUILT_MODEL_TYPES:
        raise ConversionError(
            f"model_type {model_type!r}: SIE builds GLiNER span and token models ({list(BUILT_MODEL_TYPES[1:])})",
            source=source,
        )
    for key, what in _OTHER_ARCHITECTURES.items():
        if raw.get(key):
            raise ConversionError(f"{key} is set: {what}, which SIE does not build", source=source)
    span_mode = raw.get("span_mode", "markerV0")
    if span_mode not in SPAN_MODES:
        raise ConversionError(f"span_mode {span_mode!r} is not built (supported: {list(SPAN_MODES)})", source=source)
    if span_mode == "token_level" and (raw.get("represent_spans") or raw.get("labels_encoder")):
        raise ConversionError("a token-level GLiNER that represents spans or encodes its labels apart is not built",
                              source=source)  # fmt: skip
    if raw.get("relations_layer") is not None and (span_mode != "markerV0" or raw.get("labels_encoder")):
        raise ConversionError("a GLiNER relation-extraction model is built with markerV0 spans and its labels read "
                              "with the text only", source=source)  # fmt: skip
    if raw.get("subtoken_pooling", "first") != "first":
        raise ConversionError(f"subtoken_pooling {raw['subtoken_pooling']!r} is not built (only 'first')",
                              source=source)  # fmt: skip
    if raw.get("words_splitter_type", "whitespace") != "whitespace":
        raise ConversionError(f"words_splitter_type {raw['words_splitter_type']!r} is not built (only 'whitespace')",
                              source=source)  # fmt: skip


def _positive(raw: dict[str, Any], key: str, default: int, source: str) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConversionError(f"{key} must be a positive integer, not {value!r}", source=source)
    return value


def convert_gliner(model_dir: Path, out_path: Path) -> GlinerConfig:
    """Convert a GLiNER checkpoint directory (gliner_config.json + pytorch_model.bin or model.safetensors) into an
    opset-17 ONNX graph whose output is `names.SPAN_SCORES`; a bi-encoder's label encoder into a second graph beside
    it (`names.labels_graph_path`), whose output is `names.LABEL_EMBEDDINGS`."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    config = load_gliner_config(model_dir)
    checkpoint = Checkpoint(model_dir)
    builder = GraphBuilder()
    backbone = build_backbone(
        builder, config.backbone, EncoderWeights(CheckpointPart(checkpoint, BACKBONE_PREFIX), config.backbone)
    )
    head = _GlinerHead(builder, config, HeadWeights(checkpoint))
    scores = head.build(backbone.hidden)
    labels = (
        tensor_info(LABEL_POSITIONS, TensorProto.INT64, ["batch", "labels"])
        if config.labels_encoder is None
        else tensor_info(LABEL_EMBEDDINGS, _FLOAT, ["batch", "labels", config.hidden_size])
    )
    inputs = [
        *graph_inputs(),
        tensor_info(WORD_POSITIONS, TensorProto.INT64, ["batch", "words"]),
        tensor_info(WORD_COUNTS, TensorProto.INT64, ["batch"]),
        labels,
    ]
    shape = ["batch", "words", "labels", 3] if config.token_level else ["batch", "words", config.max_width, "labels"]
    outputs = [tensor_info(scores, _FLOAT, shape)]
    if config.labels_encoder is not None:
        _convert_labels_encoder(checkpoint, config, config.labels_encoder, labels_graph_path(out_path))
    if config.relations_layer is not None:
        inputs.append(tensor_info(RELATION_POSITIONS, TensorProto.INT64, ["batch", "types"]))
        outputs += [tensor_info(WORD_EMBEDDINGS, _FLOAT, ["batch", "words", config.hidden_size]),
                    tensor_info(RELATION_EMBEDDINGS, _FLOAT, ["batch", "types", config.hidden_size])]  # fmt: skip
        convert_relations(HeadWeights(checkpoint), config.relations_layer, config.hidden_size,
                          relations_graph_path(out_path))  # fmt: skip
    save_graph(builder.model("gliner_span", inputs, outputs), out_path)
    return config


def _convert_labels_encoder(checkpoint: Checkpoint, config: GlinerConfig, encoder: BackboneConfig,
                            out_path: Path) -> None:  # fmt: skip
    """A bi-encoder's label graph: each label's tokens through its label `encoder`, projected to GLiNER's width where
    the checkpoint has a projection, mean-pooled over its real tokens: [labels, width]."""
    b = GraphBuilder()
    hidden = build_backbone(b, encoder, EncoderWeights(CheckpointPart(checkpoint, LABELS_ENCODER_PREFIX), encoder))
    weights = HeadWeights(checkpoint)
    tokens = hidden.hidden
    if weights.has("token_rep_layer.labels_projection.weight"):
        tokens = linear(b, weights, tokens, "token_rep_layer.labels_projection", encoder.hidden_size,
                        config.hidden_size)  # fmt: skip
    elif encoder.hidden_size != config.hidden_size:
        raise ConversionError(f"the label encoder is {encoder.hidden_size} wide, GLiNER {config.hidden_size}, and "
                              "there is no labels_projection")  # fmt: skip
    mask = b.op("Unsqueeze", [hidden.mask, b.const([2])], "labels.mask")
    summed = b.op("ReduceSum", [b.op("Mul", [tokens, mask], "labels.masked"), b.const([1])], "labels.sum", keepdims=0)
    counts = b.op("Max", [b.op("ReduceSum", [mask, b.const([1])], "labels.count", keepdims=0),
                          b.const(1e-9, np.float32)], "labels.count_clamped")  # fmt: skip
    pooled = b.op("Div", [summed, counts], LABEL_EMBEDDINGS)
    output = tensor_info(pooled, _FLOAT, ["labels", config.hidden_size])
    save_graph(b.model("gliner_labels", graph_inputs(), [output]), out_path)


class _GlinerHead:
    """The graph from the backbone's hidden states to the span scores."""

    def __init__(self, builder: GraphBuilder, config: GlinerConfig, weights: HeadWeights) -> None:
        self.b = builder
        self.config = config
        self.weights = weights
        self.width = config.hidden_size

    def build(self, hidden: str) -> str:
        b, width, widths = self.b, self.width, self.config.max_width
        tokens = hidden
        backbone_width = self.config.backbone.hidden_size
        if self.weights.has("token_rep_layer.projection.weight"):
            tokens = self._linear(tokens, "token_rep_layer.projection", backbone_width, width)
        elif backbone_width != width:
            raise ConversionError(f"the backbone is {backbone_width} wide, GLiNER {width}, and there is no projection")
        words = self._gather(tokens, WORD_POSITIONS, "words")
        if self.config.labels_encoder is None:
            labels = self._gather(tokens, LABEL_POSITIONS, "labels")
            for layer in range(self.config.rnn_layers):
                words = self._lstm(words, layer)
        else:  # a bi-encoder's labels come encoded; gliner runs no LSTM over its words
            labels = LABEL_EMBEDDINGS
        if self.config.relations_layer is not None:
            # The relation graph's inputs: the words as the span layer reads them, and each relation type's marker
            # as the encoder (and its projection) left it.
            b.op("Identity", [words], WORD_EMBEDDINGS)
            self._gather(tokens, RELATION_POSITIONS, RELATION_EMBEDDINGS)
        if self.config.token_level:
            return self._token_scores(words, labels)
        queries = self._mlp(labels, "prompt_rep_layer", width, width)
        logits = marker_span_logits(b, self.weights, words, queries, "span_rep_layer.span_rep_layer", width, widths)
        return b.op("Sigmoid", [logits], SPAN_SCORES)

    def _token_scores(self, words: str, labels: str) -> str:
        """A token-level model's scorer: words [B, W, D] and labels [B, C, D] each projected to two halves, and
        [word₀, label₀, word₁ · label₁] through an MLP to start, end and inside logits; out their sigmoids,
        [B, W, C, 3]. The MLP's first layer is applied to each of the three parts on its own (summed), so only the
        product is held per (word, label) pair."""
        b, width = self.b, self.width
        words_2 = self._linear(words, "scorer.proj_token", width, 2 * width)
        labels_2 = self._linear(labels, "scorer.proj_label", width, 2 * width)
        first = self.weights.get("scorer.out_mlp.0.weight", (4 * width, 3 * width))
        first_bias = self.weights.get("scorer.out_mlp.0.bias", (4 * width,))
        halves = {}
        for side, x in (("word", words_2), ("label", labels_2)):
            for half in (0, 1):
                halves[side, half] = b.op("Slice", [x, b.const([half * width]), b.const([(half + 1) * width]),
                                                    b.const([2])], f"scorer.{side}{half}")  # fmt: skip
        word_part = b.op("MatMul", [halves["word", 0], b.weight("scorer.mlp0.word", first[:, :width].T)],
                         "scorer.word_part")  # fmt: skip
        label_part = b.op("MatMul", [halves["label", 0], b.weight("scorer.mlp0.label", first[:, width : 2 * width].T)],
                          "scorer.label_part")  # fmt: skip
        # [B, W, 1, D] * [B, 1, C, D]: the product of each word and label
        product = b.op("Mul", [b.op("Unsqueeze", [halves["word", 1], b.const([2])], "scorer.word1_4d"),
                               b.op("Unsqueeze", [halves["label", 1], b.const([1])], "scorer.label1_4d")],
                       "scorer.product")  # fmt: skip
        product_part = b.op("MatMul", [product, b.weight("scorer.mlp0.product", first[:, 2 * width :].T)],
                            "scorer.product_part")  # fmt: skip
        summed = b.op("Add", [product_part, b.op("Unsqueeze", [word_part, b.const([2])], "scorer.word_part_4d")],
                      "scorer.with_word")  # fmt: skip
        summed = b.op("Add", [summed, b.op("Unsqueeze", [label_part, b.const([1])], "scorer.label_part_4d")],
                      "scorer.with_label")  # fmt: skip
        inner = b.op("Relu", [b.op("Add", [summed, b.weight("scorer.mlp0.bias", first_bias)], "scorer.biased")],
                     "scorer.relu")  # fmt: skip
        logits = self._linear(inner, "scorer.out_mlp.3", 4 * width, 3)
        return b.op("Sigmoid", [logits], TOKEN_SCORES)

    def _gather(self, tokens: str, positions: str, name: str) -> str:
        return gather_rows(self.b, tokens, positions, self.width, name)

    def _linear(self, x: str, name: str, width_in: int, width_out: int) -> str:
        return linear(self.b, self.weights, x, name, width_in, width_out)

    def _mlp(self, x: str, name: str, width_in: int, width_out: int) -> str:
        return projection_mlp(self.b, self.weights, x, name, width_in, width_out)

    def _lstm(self, words: str, layer: int) -> str:
        """One bidirectional LSTM layer over each row's first `word_counts` words."""
        return bidirectional_lstm(self.b, self.weights, words, WORD_COUNTS, "rnn.lstm", self.width, layer)
