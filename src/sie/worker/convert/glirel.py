"""GLiREL zero-shot relation extraction, config + graph: the checkpoint's backbone encoder (DeBERTa-v2/v3, BERT-like,
ModernBERT: any family `encoders.py` builds) reads the relation-type prompt (`[REL] type … [SEP]`) and the text's
words together; the hidden states are projected to GLiREL's width, each word is its first subtoken, each relation
type its `[REL]` marker, its first label token or the mean of both; a bidirectional LSTM runs over the words; each
entity the request names is its start and end word through the span marker (or the mean of its words), each pair
of entities the two concatenated and projected; a scorer (dot product, or GLiREL's normalised, thresholded or
concatenating variants) against each projected relation type gives a logit, out through a sigmoid.

Read from the `glirel` package (`model.py` GLiREL.compute_score, `modules/rel_rep.py`, `modules/layers.py`) and
checked against it on random checkpoints (tests/integration/test_glirel.py). GLiREL checkpoints save the backbone's
weights but not its config or tokenizer (`model_name` names them on the Hub): both are read from the checkpoint
directory (`config.json`, `tokenizer.json`) or from `model_name` where that is a local directory. Refinement layers,
entity markers in the text and other subtoken poolings fail the conversion naming the setting.
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
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
from sie.worker.convert.head_layers import HeadWeights, bidirectional_lstm, gather_rows, linear, projection_mlp
from sie.worker.convert.names import (
    CONFIG_FILE,
    ENTITY_PAIRS,
    ENTITY_SPANS,
    GLIREL_CONFIG_FILE,
    LABEL_POSITIONS,
    RELATION_SCORES,
    WORD_COUNTS,
    WORD_POSITIONS,
)
from sie.worker.convert.safetensors_io import Checkpoint, CheckpointPart

BACKBONE_PREFIX = "token_rep_layer.bert_layer.model."
SPAN_MARKERS = ("markerv1", "markerv2")
SCORERS = ("dot", "dot_norm", "dot_thresh", "concat_proj")
LABEL_STRATEGIES = ("ent_token", "label", "both")
# Settings of GLiREL models this graph does not build, with the value it builds.
_BUILT_SETTINGS = {
    "rel_mode": "marker",
    "subtoken_pooling": "first",
    "refine_prompt": False,
    "refine_relation": False,
    "add_entity_markers": False,
}
_MARKER = "span_rep_layer.rel_rep_layer"
_FLOAT = TensorProto.FLOAT


@attrs.frozen
class GlirelConfig:
    """The parts of `glirel_config.json` (and the backbone's config) the graph reads."""

    backbone: BackboneConfig
    hidden_size: int
    span_marker: str
    scorer: str
    label_strategy: str


def read_glirel_settings(model_dir: Path) -> dict[str, Any]:
    """`glirel_config.json` decoded, errors naming the file."""
    return read_config_json(Path(model_dir) / GLIREL_CONFIG_FILE)


def backbone_directory(model_dir: Path, settings: dict[str, Any], wanted: str) -> Path:
    """Where the backbone's `wanted` file (config.json, tokenizer.json) is: the checkpoint directory, else the local
    directory `model_name` names; a ConversionError saying where to put it when neither holds it."""
    model_dir = Path(model_dir)
    if (model_dir / wanted).is_file():
        return model_dir
    named = settings.get("model_name")
    if isinstance(named, str) and named and (Path(named) / wanted).is_file():
        return Path(named)
    raise ConversionError(
        f"no {wanted} of the backbone ({named!r}): GLiREL checkpoints do not save it; put the backbone's {wanted} "
        "beside the checkpoint",
        source=str(model_dir),
    )


def load_glirel_config(model_dir: Path, checkpoint: Checkpoint | None = None) -> GlirelConfig:
    """Read and validate the checkpoint's config and its backbone's; errors name the file and the field."""
    model_dir = Path(model_dir)
    source = str(model_dir / GLIREL_CONFIG_FILE)
    settings = read_glirel_settings(model_dir)
    for key, built in _BUILT_SETTINGS.items():
        value = settings.get(key, built)
        if value != built and not (built is False and not value):
            raise ConversionError(f"{key} {value!r} is not built (only {built!r})", source=source)
    span_marker = str(settings.get("span_marker_mode", ""))
    if span_marker not in SPAN_MARKERS:
        raise ConversionError(f"span_marker_mode {span_marker!r} is not one of {list(SPAN_MARKERS)}", source=source)
    scorer = str(settings.get("scorer", "dot"))
    if scorer not in SCORERS:
        raise ConversionError(f"scorer {scorer!r} is not one of {list(SCORERS)}", source=source)
    strategy = str(settings.get("label_embed_strategy", "ent_token"))
    if strategy not in LABEL_STRATEGIES:
        raise ConversionError(f"label_embed_strategy {strategy!r} is not one of {list(LABEL_STRATEGIES)}",
                              source=source)  # fmt: skip
    hidden_size = settings.get("hidden_size")
    if not isinstance(hidden_size, int) or isinstance(hidden_size, bool) or hidden_size < 2 or hidden_size % 2:
        raise ConversionError(f"hidden_size must be an even positive integer, not {hidden_size!r}", source=source)
    backbone_path = backbone_directory(model_dir, settings, CONFIG_FILE) / CONFIG_FILE
    backbone = dict(read_config_json(backbone_path))
    if checkpoint is not None:
        # glirel adds its markers to the tokenizer and resizes the embeddings to it: the rows are the checkpoint's
        embeddings = f"{BACKBONE_PREFIX}embeddings.word_embeddings.weight"
        if embeddings in checkpoint:
            backbone["vocab_size"] = int(checkpoint.entries[embeddings].shape[0])
    return GlirelConfig(
        backbone=parse_backbone_config(backbone, str(backbone_path)),
        hidden_size=hidden_size,
        span_marker=span_marker,
        scorer=scorer,
        label_strategy=strategy,
    )


def convert_glirel(model_dir: Path, out_path: Path) -> GlirelConfig:
    """Convert a GLiREL checkpoint directory (glirel_config.json + pytorch_model.bin or model.safetensors, the
    backbone's config.json beside it or at `model_name`) into an opset-17 ONNX graph whose output is
    `names.RELATION_SCORES`."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    checkpoint = Checkpoint(model_dir)
    config = load_glirel_config(model_dir, checkpoint)
    builder = GraphBuilder()
    backbone = build_backbone(
        builder, config.backbone, EncoderWeights(CheckpointPart(checkpoint, BACKBONE_PREFIX), config.backbone)
    )
    scores = _GlirelHead(builder, config, HeadWeights(checkpoint)).build(backbone.hidden)
    inputs = [
        *graph_inputs(),
        tensor_info(WORD_POSITIONS, TensorProto.INT64, ["batch", "words"]),
        tensor_info(WORD_COUNTS, TensorProto.INT64, ["batch"]),
        tensor_info(LABEL_POSITIONS, TensorProto.INT64, ["batch", "labels", "label_tokens"]),
        tensor_info(ENTITY_SPANS, TensorProto.INT64, ["batch", "entities", 2]),
        tensor_info(ENTITY_PAIRS, TensorProto.INT64, ["batch", "pairs", 2]),
    ]
    output = tensor_info(scores, _FLOAT, ["batch", "pairs", "labels"])
    save_graph(builder.model("glirel", inputs, [output]), out_path)
    return config


class _GlirelHead:
    """The graph from the backbone's hidden states to the relation scores."""

    def __init__(self, builder: GraphBuilder, config: GlirelConfig, weights: HeadWeights) -> None:
        self.b = builder
        self.config = config
        self.weights = weights
        self.width = config.hidden_size

    def build(self, hidden: str) -> str:
        b, width = self.b, self.width
        tokens = hidden
        backbone_width = self.config.backbone.hidden_size
        if self.weights.has("token_rep_layer.projection.weight"):
            tokens = linear(b, self.weights, tokens, "token_rep_layer.projection", backbone_width, width)
        elif backbone_width != width:
            raise ConversionError(f"the backbone is {backbone_width} wide, GLiREL {width}, and there is no projection")
        words = self._gather_rows(tokens, WORD_POSITIONS, "words")
        words = bidirectional_lstm(b, self.weights, words, WORD_COUNTS, "rnn.lstm", width)
        labels = self._labels(tokens)
        entities = self._entities(words)
        pairs = self._pairs(entities)
        labels = self._mlp(labels, "prompt_rep_layer", width, width)
        return b.op("Sigmoid", [self._score(pairs, labels)], RELATION_SCORES)

    def _labels(self, tokens: str) -> str:
        """Each relation type: the mean of the hidden states at its LABEL_POSITIONS [B, C, K]: [B, C, D]."""
        b = self.b
        shape = b.op("Shape", [LABEL_POSITIONS], "labels.shape")
        flat = b.op("Reshape", [LABEL_POSITIONS, b.const([0, -1])], "labels.flat_positions")
        gathered = self._gather_rows(tokens, flat, "labels.tokens")
        grouped = b.op("Reshape", [gathered, b.op("Concat", [shape, b.const([self.width])], "labels.grouped_shape",
                                                  axis=0)], "labels.grouped")  # fmt: skip
        return b.op("ReduceMean", [grouped], "labels", axes=[2], keepdims=0)

    def _entities(self, words: str) -> str:
        """Each entity's representation [B, E, D] from its first and last word (ENTITY_SPANS)."""
        b, width = self.b, self.width
        marker = f"{_MARKER}.span_marker"
        start_index = b.op("Gather", [ENTITY_SPANS, b.const(0)], "entities.start", axis=2)
        end_index = b.op("Gather", [ENTITY_SPANS, b.const(1)], "entities.end", axis=2)
        if self.config.span_marker == "markerv1":
            starts = self._gather_rows(self._mlp(words, f"{marker}.project_start", width, width), start_index,
                                       "entities.start_rep")  # fmt: skip
            ends = self._gather_rows(self._mlp(words, f"{marker}.project_end", width, width), end_index,
                                     "entities.end_rep")  # fmt: skip
            joined = b.op("Relu", [b.op("Concat", [starts, ends], "entities.joined", axis=2)], "entities.relu")
            return self._mlp(joined, f"{marker}.out_project", 2 * width, width)
        # markerv2: the mean of the span's words, projected
        positions = b.op("Range", [b.const(0), b.op("Squeeze", [b.op("Shape", [words], "entities.word_count",
                                                                     start=1, end=2), b.const([0])],
                                                    "entities.words"), b.const(1)], "entities.positions")  # fmt: skip
        after_start = b.op(
            "GreaterOrEqual",
            [positions, b.op("Unsqueeze", [start_index, b.const([2])], "entities.start_3d")],
            "entities.after_start",
        )
        before_end = b.op("LessOrEqual", [positions, b.op("Unsqueeze", [end_index, b.const([2])],
                                                          "entities.end_3d")], "entities.before_end")  # fmt: skip
        inside = b.op("Cast", [b.op("And", [after_start, before_end], "entities.inside")], "entities.weights",
                      to=_FLOAT)  # fmt: skip
        summed = b.op("MatMul", [inside, words], "entities.summed")
        counts = b.op("ReduceSum", [inside, b.const([2])], "entities.counts", keepdims=1)
        mean = b.op("Div", [summed, b.op("Max", [counts, b.const(1.0, np.float32)], "entities.counts_min1")],
                    "entities.mean")  # fmt: skip
        return self._mlp(mean, f"{marker}.projection", width, width)

    def _pairs(self, entities: str) -> str:
        """Each pair's head and tail entity (ENTITY_PAIRS), concatenated and projected: [B, P, D]."""
        b, width = self.b, self.width
        heads = self._gather_rows(entities, b.op("Gather", [ENTITY_PAIRS, b.const(0)], "pairs.head", axis=2),
                                  "pairs.head_rep")  # fmt: skip
        tails = self._gather_rows(entities, b.op("Gather", [ENTITY_PAIRS, b.const(1)], "pairs.tail", axis=2),
                                  "pairs.tail_rep")  # fmt: skip
        joined = b.op("Concat", [heads, tails], "pairs.joined", axis=2)
        return self._mlp(joined, f"{_MARKER}.out_project", 2 * width, width)

    def _score(self, pairs: str, labels: str) -> str:
        """The scorer's logits [B, P, C] of pairs [B, P, D] against relation types [B, C, D]."""
        b, width, scorer = self.b, self.width, self.config.scorer
        if scorer == "dot_thresh":
            scale = self._mlp(labels, "scorer.proj_thresh", width, 2, inner=4 * width)
            alpha = b.op("Softplus", [b.op("Gather", [scale, b.const(0)], "scorer.alpha_raw", axis=2)], "scorer.alpha")
            beta = b.op("Gather", [scale, b.const(1)], "scorer.beta", axis=2)
            labels = self._mlp(labels, "scorer.proj_type", width, width)
        if scorer == "concat_proj":
            return self._concat_scores(pairs, labels)
        labels_t = b.op("Transpose", [labels], "scorer.labels_t", perm=[0, 2, 1])
        logits = b.op("MatMul", [pairs, labels_t], "scorer.dot")
        if scorer == "dot_thresh":
            shifted = b.op("Add", [logits, b.op("Unsqueeze", [beta, b.const([1])], "scorer.beta_3d")], "scorer.shift")
            return b.op("Mul", [shifted, b.op("Unsqueeze", [alpha, b.const([1])], "scorer.alpha_3d")], "scorer.scaled")
        if scorer == "dot_norm":
            label_bias = self._mlp(labels, "scorer.dy_bias_type", width, 1, inner=4 * width)
            pair_bias = self._mlp(pairs, "scorer.dy_bias_rel", width, 1, inner=4 * width)
            bias = b.weight("scorer.bias", self.weights.get("scorer.bias", ()).reshape(()))
            logits = b.op("Add", [logits, b.op("Transpose", [label_bias], "scorer.label_bias_t", perm=[0, 2, 1])],
                          "scorer.with_label_bias")  # fmt: skip
            logits = b.op("Add", [logits, pair_bias], "scorer.with_pair_bias")
            logits = b.op("Add", [logits, bias], "scorer.with_bias")
        return logits

    def _concat_scores(self, pairs: str, labels: str) -> str:
        """concat_proj: an MLP over [pair × type, pair − type, pair, type] for every (pair, type): [B, P, C]."""
        b, width = self.b, self.width
        pair_4d = b.op("Unsqueeze", [pairs, b.const([2])], "scorer.pairs_4d")  # [B, P, 1, D]
        label_4d = b.op("Unsqueeze", [labels, b.const([1])], "scorer.labels_4d")  # [B, 1, C, D]
        product = b.op("Mul", [pair_4d, label_4d], "scorer.product")
        difference = b.op("Sub", [pair_4d, label_4d], "scorer.difference")
        shape = b.op("Shape", [product], "scorer.grid_shape")
        pair_grid = b.op("Expand", [pair_4d, shape], "scorer.pair_grid")
        label_grid = b.op("Expand", [label_4d, shape], "scorer.label_grid")
        features = b.op("Concat", [product, difference, pair_grid, label_grid], "scorer.features", axis=3)
        logits = self._mlp(features, "scorer.proj", 4 * width, 1, inner=4 * width)
        return b.op("Squeeze", [logits, b.const([3])], "scorer.concat")

    def _gather_rows(self, values: str, positions: str, name: str) -> str:
        return gather_rows(self.b, values, positions, self.width, name)

    def _mlp(self, x: str, name: str, width_in: int, width_out: int, inner: int | None = None) -> str:
        return projection_mlp(self.b, self.weights, x, name, width_in, width_out, inner)
