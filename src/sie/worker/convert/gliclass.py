"""GLiClass uni-encoder classifiers, config + graph: the labels (each after a `<<LABEL>>` marker) and the text are
read together by the checkpoint's backbone encoder (DeBERTa-v2/v3, BERT-like, ModernBERT); the text is pooled (after
an optional BiLSTM over the tokens) and projected, each label is its marker's hidden state (or the mean of its
tokens) projected, and a scorer (a dot product, GLiClass's weighted dot or its MLP) gives one logit per label.

Read from the `gliclass` package (`model.py` GLiClassUniEncoder, `layers.py`, `poolings.py`, `scorers.py`) and checked
against its pipeline on random checkpoints (tests/integration/test_gliclass.py). The graph takes, beside the
backbone's inputs, `names.LABEL_WEIGHTS` [B, C, S]: which tokens each label's representation averages (one token for
`first` pooling), found by the adapter, so label sets may differ from row to row. Text pooling reads real tokens only
(gliclass pools padding too, so its scores move with the batch a text is padded in; ours equal its unpadded ones).
A model that reads the first token and each label's marker alone (`first` text pooling, `first` class-token pooling,
no LSTM) has its backbone's last layer computed at those tokens only (`build_backbone`'s rows: the markers are
LABEL_WEIGHTS' one-hot positions).
Other GLiClass architectures (bi-encoder, encoder-decoder, decoder-kv), scorers, poolings and layer choices fail the
conversion naming what they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import EncoderWeights, first_rows, gelu, graph_inputs
from sie.worker.convert.encoders import BackboneConfig, build_backbone, computes_rows, parse_backbone_config
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import read_config_json
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
from sie.worker.convert.head_layers import HeadWeights, bidirectional_lstm, linear
from sie.worker.convert.names import CONFIG_FILE, LABEL_WEIGHTS, LOGITS
from sie.worker.convert.safetensors_io import Checkpoint, CheckpointPart

BACKBONE_PREFIX = "model.encoder_model."
HEAD_PREFIX = "model."
POOLINGS = ("first", "last", "avg", "sum", "max")
SCORERS = ("simple", "weighted-dot", "mlp")
ACTIVATIONS = ("gelu", "relu", "tanh", "silu")
# Settings of other GLiClass models than the ones this graph builds, with the value it builds.
_BUILT_SETTINGS = {
    "architecture_type": "uni-encoder",
    "squeeze_layers": False,
    "use_segment_embeddings": False,
    "encoder_layer_id": -1,
    "multimodal": False,
    "use_calibrator": False,
    "label_model_name": None,
}
_FLOAT = TensorProto.FLOAT


@attrs.frozen
class GliclassConfig:
    """The parts of a GLiClass config.json the graph reads."""

    backbone: BackboneConfig
    hidden_size: int  # the projectors' inner width
    pooling: str
    scorer: str
    activation: str
    use_lstm: bool
    normalize_features: bool
    class_token_pooling: str = "first"  # each label's marker ("first") or its tokens' mean ("average")

    @property
    def reads_rows(self) -> bool:
        """Whether the head reads a few tokens' states only (the first token, each label's marker), so the
        backbone's last layer need only be computed there."""
        return (self.pooling == "first" and self.class_token_pooling == "first" and not self.use_lstm
                and computes_rows(self.backbone))  # fmt: skip


def parse_gliclass_config(raw: dict[str, Any], source: str) -> GliclassConfig:
    for key, built in _BUILT_SETTINGS.items():
        if raw.get(key, built) != built:
            raise ConversionError(f"{key} is {raw[key]!r}: SIE builds GLiClass models with {key} {built!r}",
                                  source=source)  # fmt: skip
    choices = {"pooling_strategy": POOLINGS, "scorer_type": SCORERS, "projector_hidden_act": ACTIVATIONS}
    defaults = {"pooling_strategy": "first", "scorer_type": "simple", "projector_hidden_act": "gelu"}
    for key, allowed in choices.items():
        if raw.get(key, defaults[key]) not in allowed:
            raise ConversionError(f"{key} {raw[key]!r} is not built (supported: {list(allowed)})", source=source)
    backbone = raw.get("encoder_config")
    if not isinstance(backbone, dict):
        raise ConversionError("no encoder_config: the backbone's config is not saved with the checkpoint",
                              source=source)  # fmt: skip
    backbone = dict(backbone)
    backbone.setdefault("model_type", "deberta-v2")
    parsed = parse_backbone_config(backbone, f"{source} encoder_config")
    return GliclassConfig(
        backbone=parsed,
        hidden_size=int(raw.get("hidden_size") or parsed.hidden_size),
        pooling=raw.get("pooling_strategy", "first"),
        scorer=raw.get("scorer_type", "simple"),
        activation=raw.get("projector_hidden_act", "gelu"),
        use_lstm=bool(raw.get("use_lstm", False)),
        normalize_features=bool(raw.get("normalize_features", False)),
        class_token_pooling=raw.get("class_token_pooling", "first"),
    )


def convert_gliclass(model_dir: Path, out_path: Path) -> GliclassConfig:
    """Convert a GLiClass checkpoint directory (config.json + model.safetensors or pytorch_model.bin) into an
    opset-17 ONNX graph whose output is `names.LOGITS` [B, C]."""
    model_dir = Path(model_dir)
    path = model_dir / CONFIG_FILE
    config = parse_gliclass_config(read_config_json(path), str(path))
    checkpoint = Checkpoint(model_dir)
    builder = GraphBuilder()
    rows = ""
    if config.reads_rows:  # the first token, then each label's marker (its one-hot row of LABEL_WEIGHTS)
        markers = builder.op("ArgMax", [LABEL_WEIGHTS], "classes.markers", axis=2, keepdims=0)
        rows = builder.op("Concat", [first_rows(builder), markers], "rows.read", axis=1)
    weights = EncoderWeights(CheckpointPart(checkpoint, BACKBONE_PREFIX), config.backbone)
    backbone = build_backbone(builder, config.backbone, weights, rows=rows)
    logits = _GliclassHead(builder, config, HeadWeights(checkpoint, HEAD_PREFIX)).build(backbone.hidden, bool(rows))
    inputs = [*graph_inputs(), tensor_info(LABEL_WEIGHTS, _FLOAT, ["batch", "labels", "sequence"])]
    save_graph(builder.model("gliclass", inputs, [tensor_info(logits, _FLOAT, ["batch", "labels"])]), Path(out_path))
    return config


class _GliclassHead:
    """The graph from the backbone's hidden states to one logit per label."""

    def __init__(self, builder: GraphBuilder, config: GliclassConfig, weights: HeadWeights) -> None:
        self.b = builder
        self.config = config
        self.weights = weights
        self.width = config.backbone.hidden_size

    def build(self, hidden: str, at_rows: bool) -> str:
        """`hidden` is [B, S, H], or with `at_rows` [B, 1 + C, H]: the first token's state, then each label
        marker's."""
        b, width = self.b, self.width
        mask = b.op("Cast", ["attention_mask"], "text.mask", to=TensorProto.FLOAT)
        tokens = hidden
        if self.config.use_lstm:
            lengths = b.op("ReduceSum", ["attention_mask", b.const([1])], "text.lengths", keepdims=0)
            tokens = bidirectional_lstm(b, self.weights, tokens, lengths, "lstm.lstm", width)
        text = self._project(self._pool(tokens, mask), "text_projector")
        if at_rows:  # each label marker's state (a label slot the row leaves empty reads the first token's: its
            # logit is never read)
            classes = b.op("Slice", [hidden, b.const([1]), b.const([2**62]), b.const([1])], "classes.pooled")
        else:
            classes = b.op("MatMul", [LABEL_WEIGHTS, hidden], "classes.pooled")  # [B, C, S] x [B, S, H]
        classes = self._project(classes, "classes_projector")
        if self.config.normalize_features:
            text, classes = self._normalized(text, "text"), self._normalized(classes, "classes")
        logits = self._score(text, classes)
        if self.config.normalize_features:
            scale = self.weights.get("logit_scale", ())
            logits = b.op("Mul", [logits, b.const(float(scale), np.float32)], "logits.scaled")
        return b.op("Identity", [logits], LOGITS)

    def _pool(self, tokens: str, mask: str) -> str:
        """[B, S, H] to [B, H] over each row's real tokens (all of them right-padded)."""
        b, pooling = self.b, self.config.pooling
        if pooling == "first":
            return b.op("Gather", [tokens, b.const(0)], "text.first", axis=1)
        mask_3d = b.op("Unsqueeze", [mask, b.const([2])], "text.mask_3d")
        counts = b.op("ReduceSum", [mask, b.const([1])], "text.counts", keepdims=1)
        if pooling == "last":
            last = b.op("Sub", [b.op("Cast", [counts], "text.counts_int", to=TensorProto.INT64), b.const(1)],
                        "text.last_index")  # fmt: skip
            shape = b.op("Concat", [b.op("Shape", [tokens], "text.shape", end=1), b.const([1, self.width])],
                         "text.last_shape", axis=0)  # fmt: skip
            index = b.op("Expand", [b.op("Unsqueeze", [last, b.const([2])], "text.last_3d"), shape],
                         "text.last_expanded")  # fmt: skip
            gathered = b.op("GatherElements", [tokens, index], "text.last_rows", axis=1)
            return b.op("Squeeze", [gathered, b.const([1])], "text.last")
        if pooling == "max":
            filler = b.op("Mul", [b.op("Sub", [b.const(1.0, np.float32), mask_3d], "text.padding"),
                                  b.const(-1e30, np.float32)], "text.padding_bias")  # fmt: skip
            return b.op("ReduceMax", [b.op("Add", [tokens, filler], "text.masked_max")], "text.max", axes=[1],
                        keepdims=0)  # fmt: skip
        summed = b.op("ReduceSum", [b.op("Mul", [tokens, mask_3d], "text.masked"), b.const([1])], "text.sum",
                      keepdims=0)  # fmt: skip
        return summed if pooling == "sum" else b.op("Div", [summed, counts], "text.avg")

    def _project(self, x: str, name: str) -> str:
        """GLiClass's FeaturesProjector: Linear to hidden_size, the activation, Linear back to the encoder width."""
        inner = linear(self.b, self.weights, x, f"{name}.linear_1", self.width, self.config.hidden_size)
        return linear(self.b, self.weights, self._activate(inner, f"{name}.act"), f"{name}.linear_2",
                      self.config.hidden_size, self.width)  # fmt: skip

    def _activate(self, x: str, name: str) -> str:
        activation = self.config.activation
        if activation == "gelu":
            return gelu(self.b, x, name)
        if activation == "silu":
            return self.b.op("Mul", [x, self.b.op("Sigmoid", [x], f"{name}.sigmoid")], name)
        return self.b.op({"relu": "Relu", "tanh": "Tanh"}[activation], [x], name)

    def _normalized(self, x: str, name: str) -> str:
        """x / (‖x‖ + 1e-8), as GLiClass normalizes features."""
        b = self.b
        norm = b.op("ReduceL2", [x], f"{name}.norm", axes=[-1], keepdims=1)
        return b.op("Div", [x, b.op("Add", [norm, b.const(1e-8, np.float32)], f"{name}.norm_eps")], f"{name}.unit")

    def _score(self, text: str, classes: str) -> str:
        """text [B, H] against classes [B, C, H]: [B, C]."""
        b, width, scorer = self.b, self.width, self.config.scorer
        if scorer == "simple":
            product = b.op("MatMul", [classes, b.op("Unsqueeze", [text, b.const([2])], "text.column")], "scores.dot")
            return b.op("Squeeze", [product, b.const([2])], "scores")
        if scorer == "mlp":
            text_row = b.op("Unsqueeze", [text, b.const([1])], "text.row")
            texts = b.op("Expand", [text_row, b.op("Shape", [classes], "shape.classes")], "text.per_class")
            x = b.op("Concat", [texts, classes], "scorer.input", axis=2)
            hidden_first = self.weights.shape("scorer.mlp.0.weight")[0]
            hidden_second = self.weights.shape("scorer.mlp.2.weight")[0]
            x = b.op("Relu", [linear(b, self.weights, x, "scorer.mlp.0", 2 * width, hidden_first)], "scorer.relu0")
            x = b.op("Relu", [linear(b, self.weights, x, "scorer.mlp.2", hidden_first, hidden_second)],
                     "scorer.relu2")  # fmt: skip
            out = linear(b, self.weights, x, "scorer.mlp.4", hidden_second, 1)
            return b.op("Squeeze", [out, b.const([2])], "scores")
        # weighted-dot: both sides projected to two halves; [text₀, label₀, text₁ · label₁] through an MLP
        text_halves = linear(b, self.weights, text, "scorer.proj_text", width, 2 * width)  # [B, 2H]
        label_halves = linear(b, self.weights, classes, "scorer.proj_label", width, 2 * width)  # [B, C, 2H]
        text_row = b.op("Unsqueeze", [text_halves, b.const([1])], "scorer.text_row")  # [B, 1, 2H]
        text_first = b.op("Slice", [text_row, b.const([0]), b.const([width]), b.const([2])], "scorer.text0")
        text_second = b.op("Slice", [text_row, b.const([width]), b.const([2 * width]), b.const([2])], "scorer.text1")
        label_first = b.op("Slice", [label_halves, b.const([0]), b.const([width]), b.const([2])], "scorer.label0")
        label_second = b.op("Slice", [label_halves, b.const([width]), b.const([2 * width]), b.const([2])],
                            "scorer.label1")  # fmt: skip
        texts = b.op("Expand", [text_first, b.op("Shape", [label_first], "shape.label0")], "scorer.text0_per_class")
        product = b.op("Mul", [text_second, label_second], "scorer.product")
        x = b.op("Concat", [texts, label_first, product], "scorer.input", axis=2)
        x = b.op("Relu", [linear(b, self.weights, x, "scorer.out_mlp.0", 3 * width, 4 * width)], "scorer.relu")
        out = linear(b, self.weights, x, "scorer.out_mlp.3", 4 * width, 1)
        return b.op("Squeeze", [out, b.const([2])], "scores")
