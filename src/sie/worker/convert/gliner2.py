"""GLiNER2 span checkpoints (fastino's `gliner2` package, `architecture: span`), config + graph: the encoder reads a
schema (`( [P] task ( [E] label [E] label … ) )`, or `[L]` markers for a classification task) and the text's words
after `[SEP_TEXT]`; each text word is its first subtoken, the schema's markers are read at their own positions. From
the `[P]` marker the count head predicts how many instances of the structure the text holds (the adapter reads none
as no entities); each field marker becomes the first instance's query through the count module (a GRU step from the
first count embedding with the marker as its state, then an MLP of it and the marker — or, `count_lstm_v2`, a small
transformer over the row's fields); every span of up to `max_width` words (GLiNER's `markerV0` layer) is scored
against each query, through a sigmoid; and each field marker's classifier logit is the classification task's.

Read from the `gliner2` package (`models/span/model.py`, `layers.py`, `processor.py`, `inference/runtime.py`) and
checked against it on random checkpoints (tests/integration/test_gliner2.py). Boundary checkpoints (GLiNER2.5),
the mixture-of-experts count module and pooled subtokens fail the conversion naming what they are.
"""

from __future__ import annotations

import math
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
from sie.worker.convert.head_layers import HeadWeights, gather_rows, linear, marker_span_logits
from sie.worker.convert.names import (
    CLASS_LOGITS,
    CONFIG_FILE,
    COUNT_LOGITS,
    ENCODER_CONFIG_DIR,
    FIELD_COUNTS,
    GLINER2_MODEL_TYPE,
    INSTANCES,
    SCHEMA_POSITIONS,
    SPAN_SCORES,
    WORD_COUNTS,
    WORD_POSITIONS,
)
from sie.worker.convert.safetensors_io import Checkpoint, CheckpointPart

ENCODER_PREFIX = "encoder."
COUNTING_LAYERS = ("count_lstm", "count_lstm_v2")
MAX_COUNT = 20  # the count head's classes and the count module's embeddings (gliner2's max_count)
# count_lstm_v2's transformer over the fields: its width, heads and layers (gliner2's DownscaledTransformer).
FIELD_TRANSFORMER_WIDTH = 128
FIELD_TRANSFORMER_HEADS = 4
FIELD_TRANSFORMER_LAYERS = 2
_FLOAT = TensorProto.FLOAT


@attrs.frozen
class Gliner2Config:
    """The parts of a GLiNER2 span checkpoint's config.json the graph reads, with its encoder's config."""

    encoder: BackboneConfig
    max_width: int
    counting_layer: str

    @property
    def width(self) -> int:
        return self.encoder.hidden_size


def is_gliner2_config(raw: dict[str, Any]) -> bool:
    """Whether a config.json is a GLiNER2 extractor's (either architecture)."""
    return raw.get("model_type") == GLINER2_MODEL_TYPE


def load_gliner2_config(model_dir: Path) -> Gliner2Config:
    """Read and validate config.json and encoder_config/config.json; errors name the file and the field."""
    path = Path(model_dir) / CONFIG_FILE
    raw = read_config_json(path)
    source = str(path)
    architecture = raw.get("architecture") or "span"
    if architecture != "span":
        raise ConversionError(
            f"architecture {architecture!r}: a GLiNER2.5 {architecture} checkpoint, which SIE does not build (only "
            "GLiNER2's span architecture)",
            source=source,
        )
    span_head = raw.get("span_head") or {}
    span_mode = span_head.get("span_mode", "markerV0")
    if span_mode != "markerV0":
        raise ConversionError(f"span_head.span_mode {span_mode!r} is not built (only 'markerV0')", source=source)
    counting = raw.get("counting_layer") or "count_lstm"
    if counting not in COUNTING_LAYERS:
        raise ConversionError(f"counting_layer {counting!r} is not built (supported: {list(COUNTING_LAYERS)})",
                              source=source)  # fmt: skip
    pooling = raw.get("token_pooling", "first")
    if pooling != "first":
        raise ConversionError(f"token_pooling {pooling!r} is not built (only 'first')", source=source)
    max_width = span_head.get("max_width", raw.get("max_width", 8))
    if not isinstance(max_width, int) or isinstance(max_width, bool) or max_width < 1:
        raise ConversionError(f"max_width must be a positive integer, not {max_width!r}", source=source)
    encoder_path = Path(model_dir) / ENCODER_CONFIG_DIR / CONFIG_FILE
    encoder = parse_backbone_config(read_config_json(encoder_path), str(encoder_path))
    return Gliner2Config(encoder, max_width, counting)


def convert_gliner2(model_dir: Path, out_path: Path) -> Gliner2Config:
    """Convert a GLiNER2 span checkpoint directory (config.json, encoder_config/, model.safetensors) into an opset-17
    ONNX graph whose outputs are `names.SPAN_SCORES`, `COUNT_LOGITS` and `CLASS_LOGITS`."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    config = load_gliner2_config(model_dir)
    checkpoint = Checkpoint(model_dir)
    builder = GraphBuilder()
    encoder = build_backbone(
        builder, config.encoder, EncoderWeights(CheckpointPart(checkpoint, ENCODER_PREFIX), config.encoder)
    )
    head = _Gliner2Head(builder, config, HeadWeights(checkpoint))
    spans, counts, classes = head.build(encoder.hidden)
    inputs = [
        *graph_inputs(),
        tensor_info(WORD_POSITIONS, TensorProto.INT64, ["batch", "words"]),
        tensor_info(WORD_COUNTS, TensorProto.INT64, ["batch"]),
        tensor_info(SCHEMA_POSITIONS, TensorProto.INT64, ["batch", "schemas", "markers"]),
        tensor_info(FIELD_COUNTS, TensorProto.INT64, ["batch", "schemas"]),
        tensor_info(INSTANCES, TensorProto.INT64, ["instances"]),
    ]
    outputs = [
        tensor_info(spans, _FLOAT, ["batch", "words", config.max_width, "queries"]),
        tensor_info(counts, _FLOAT, ["batch", "schemas", MAX_COUNT]),
        tensor_info(classes, _FLOAT, ["batch", "schemas", "fields"]),
    ]
    save_graph(builder.model("gliner2_span", inputs, outputs), out_path)
    return config


class _Gliner2Head:
    """The graph from the encoder's hidden states to the span scores, count logits and classifier logits."""

    def __init__(self, builder: GraphBuilder, config: Gliner2Config, weights: HeadWeights) -> None:
        self.b = builder
        self.config = config
        self.weights = weights
        self.width = config.width

    def build(self, hidden: str) -> tuple[str, str, str]:
        b, width = self.b, self.width
        words = gather_rows(b, hidden, WORD_POSITIONS, width, "words")
        # [B, S, 1 + M] positions -> [B, S, 1 + M, D]: each schema's [P] and field markers
        flat = b.op("Reshape", [SCHEMA_POSITIONS, b.const([0, -1])], "markers.flat_positions")
        marker_shape = b.op("Concat", [b.op("Shape", [SCHEMA_POSITIONS], "markers.shape"), b.const([width])],
                            "markers.shape_4d", axis=0)  # fmt: skip
        markers = b.op("Reshape", [gather_rows(b, hidden, flat, width, "markers.flat"), marker_shape], "markers")
        task = b.op("Squeeze", [b.op("Slice", [markers, b.const([0]), b.const([1]), b.const([2])], "task_4d"),
                                b.const([2])], "task")  # fmt: skip
        fields = b.op("Slice", [markers, b.const([1]), b.const([np.iinfo(np.int64).max]), b.const([2])], "fields")
        counts = self._mlp(task, "count_pred", [2 * width, MAX_COUNT], COUNT_LOGITS)
        classes = b.op("Squeeze", [self._mlp(fields, "classifier", [2 * width, 1], "classifier.logits"),
                                   b.const([3])], CLASS_LOGITS)  # fmt: skip
        queries = self._instances(fields)
        logits = marker_span_logits(b, self.weights, words, queries, "span_rep.span_rep_layer", width,
                                    self.config.max_width)  # fmt: skip
        return b.op("Sigmoid", [logits], SPAN_SCORES), counts, classes

    def _instances(self, fields: str) -> str:
        """The count module's structure instances `INSTANCES` for each field of each schema, as span queries
        [B, S * I * M, D] in (schema, instance, field) order: a GRU over the instances' count embeddings, each
        field its initial state (torch's GRU is ONNX's with `linear_before_reset`); then count_lstm's MLP over
        [state, field], or count_lstm_v2's transformer over each schema's fields (state + field), per instance."""
        b, width = self.b, self.width
        table = self.weights.get("count_embed.pos_embedding.weight", (MAX_COUNT, width))
        steps = b.op("Gather", [b.weight("count.pos_embedding", table), INSTANCES], "count.steps_2d", axis=0)
        steps = b.op("Unsqueeze", [steps, b.const([1])], "count.steps")  # [I, 1, D]
        states = b.op("Reshape", [fields, b.const([1, -1, width])], "count.initial")  # [1, N = B * S * M, D]
        x_shape = b.op("Concat", [b.op("Shape", [steps], "count.i", end=1),
                                  b.op("Shape", [states], "count.nd", start=1)], "count.x_shape", axis=0)  # fmt: skip
        sequence = b.op("Expand", [steps, x_shape], "count.x")  # [I, N, D]
        gru = {}
        for kind in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            stored = self.weights.get(
                f"count_embed.gru.{kind}", (3 * width, width) if "weight" in kind else (3 * width,)
            )
            reset, update, candidate = np.split(stored, 3)
            gru[kind] = np.concatenate([update, reset, candidate])  # ONNX orders the gates update, reset, hidden
        hidden = b.op("GRU", [sequence, b.weight("count.gru.W", gru["weight_ih_l0"][None]),
                              b.weight("count.gru.R", gru["weight_hh_l0"][None]),
                              b.weight("count.gru.B", np.concatenate([gru["bias_ih_l0"], gru["bias_hh_l0"]])[None]),
                              "", states], "count.gru", hidden_size=width, linear_before_reset=1)  # fmt: skip
        hidden = b.op("Squeeze", [hidden, b.const([1])], "count.hidden")  # [I, N, D]
        each_field = b.op("Expand", [states, b.op("Shape", [hidden], "count.hidden_shape")], "count.fields")
        if self.config.counting_layer == "count_lstm":
            joined = b.op("Concat", [hidden, each_field], "count.joined", axis=2)
            queries = self._mlp(joined, "count_embed.projector", [4 * width, width], "count.projected",
                                width_in=2 * width)  # fmt: skip
        else:  # [I, N, D] -> [I * B * S, M, D]: attention within each schema's fields, per instance
            per_schema_shape = b.op("Concat", [b.const([-1]), b.op("Shape", [fields], "fields.md", start=2)],
                                    "count.per_schema_shape", axis=0)  # fmt: skip
            seeded = b.op("Add", [hidden, each_field], "count.seeded")
            queries = self._field_transformer(b.op("Reshape", [seeded, per_schema_shape], "count.per_schema"))
        # [I, B, S, M, D] -> [B, S, I, M, D] -> [B, S * I * M, D]
        out_shape = b.op("Concat", [b.const([-1]), b.op("Shape", [fields], "fields.shape")], "count.out_shape", axis=0)
        instances = b.op("Reshape", [queries, out_shape], "count.instances")
        ordered = b.op("Transpose", [instances], "count.ordered", perm=[1, 2, 0, 3, 4])
        return b.op("Reshape", [ordered, b.const([0, -1, width])], "count.queries")

    def _field_transformer(self, x: str) -> str:
        """count_lstm_v2's DownscaledTransformer over each row's fields (padding fields masked as keys): in
        projection, post-norm encoder layers (ReLU feed-forward), then an MLP over [their output, x]."""
        b, width, inner = self.b, self.width, FIELD_TRANSFORMER_WIDTH
        prefix = "count_embed.transformer"
        h = linear(b, self.weights, x, f"{prefix}.in_projector", width, inner)
        # [I * B * S, M] -> [I * B * S, 1, 1, M]: 0 for a real field of its schema, a large negative number for
        # padding (the field counts [B, S] repeated for every instance)
        positions = b.op("Range", [b.const(0), b.op("Squeeze", [b.op("Shape", [x], "fields.m", start=1, end=2),
                                                                  b.const([0])], "fields.count"),
                                   b.const(1)], "fields.range")  # fmt: skip
        counts = b.op("Tile", [b.op("Reshape", [FIELD_COUNTS, b.const([1, -1])], "fields.counts_row"),
                               b.op("Concat", [b.op("Shape", [INSTANCES], "fields.instances"), b.const([1])],
                                    "fields.tiles", axis=0)], "fields.counts_tiled")  # fmt: skip
        counts = b.op("Reshape", [counts, b.const([-1, 1])], "fields.counts_2d")
        real = b.op("Less", [b.op("Unsqueeze", [positions, b.const([0])], "fields.range_2d"), counts], "fields.real")
        bias = b.op("Where", [real, b.const(0.0, np.float32), b.const(-1e9, np.float32)], "fields.bias")
        bias = b.op("Unsqueeze", [bias, b.const([1, 2])], "fields.bias_4d")
        for layer in range(FIELD_TRANSFORMER_LAYERS):
            name = f"{prefix}.transformer.layers.{layer}"
            attended = self._self_attention(h, bias, f"{name}.self_attn")
            h = self._layer_norm(b.op("Add", [h, attended], f"{name}.residual1"), f"{name}.norm1")
            hidden = b.op("Relu", [linear(b, self.weights, h, f"{name}.linear1", inner, 2 * inner)], f"{name}.relu")
            fed = linear(b, self.weights, hidden, f"{name}.linear2", 2 * inner, inner)
            h = self._layer_norm(b.op("Add", [h, fed], f"{name}.residual2"), f"{name}.norm2")
        joined = b.op("Concat", [h, x], "count.transformer.joined", axis=2)
        return self._mlp(joined, f"{prefix}.out_projector", [width, width, width], "count.queries",
                         width_in=inner + width)  # fmt: skip

    def _self_attention(self, x: str, bias: str, name: str) -> str:
        """torch's MultiheadAttention `name` (packed in_proj) of `x` [B, M, 128] over itself, `bias` added to the
        scores."""
        b, inner, heads = self.b, FIELD_TRANSFORMER_WIDTH, FIELD_TRANSFORMER_HEADS
        head_width = inner // heads
        in_weight = self.weights.get(f"{name}.in_proj_weight", (3 * inner, inner))
        in_bias = self.weights.get(f"{name}.in_proj_bias", (3 * inner,))
        split = []
        for index, part in enumerate(("q", "k", "v")):
            rows = slice(index * inner, (index + 1) * inner)
            projected = b.op("Add", [b.op("MatMul", [x, b.weight(f"{name}.{part}.w", in_weight[rows].T)],
                                          f"{name}.{part}.mm"), b.weight(f"{name}.{part}.b", in_bias[rows])],
                             f"{name}.{part}")  # fmt: skip
            heads_4d = b.op("Reshape", [projected, b.const([0, 0, heads, head_width])], f"{name}.{part}.heads")
            split.append(b.op("Transpose", [heads_4d], f"{name}.{part}.t", perm=[0, 2, 1, 3]))
        query, key, value = split
        scores = b.op("MatMul", [query, b.op("Transpose", [key], f"{name}.kt", perm=[0, 1, 3, 2])], f"{name}.qk")
        scores = b.op("Mul", [scores, b.const(1.0 / math.sqrt(head_width), np.float32)], f"{name}.scaled")
        weights = b.op("Softmax", [b.op("Add", [scores, bias], f"{name}.masked")], f"{name}.weights", axis=-1)
        context = b.op("Transpose", [b.op("MatMul", [weights, value], f"{name}.context_heads")], f"{name}.context_t",
                       perm=[0, 2, 1, 3])  # fmt: skip
        merged = b.op("Reshape", [context, b.const([0, 0, inner])], f"{name}.context")
        return linear(b, self.weights, merged, f"{name}.out_proj", inner, inner)

    def _layer_norm(self, x: str, name: str) -> str:
        width = FIELD_TRANSFORMER_WIDTH
        scale = self.b.weight(f"{name}.weight", self.weights.get(f"{name}.weight", (width,)))
        shift = self.b.weight(f"{name}.bias", self.weights.get(f"{name}.bias", (width,)))
        return self.b.op("LayerNormalization", [x, scale, shift], f"{name}.out", axis=-1, epsilon=1e-5)

    def _mlp(self, x: str, name: str, widths: list[int], output: str, width_in: int | None = None) -> str:
        """gliner2's `create_mlp` without dropout: Linear layers at Sequential indices 0, 2, 4, … with ReLU between;
        the last layer's output named `output`."""
        b, current = self.b, width_in or self.width
        for index, width_out in enumerate(widths):
            layer = f"{name}.{2 * index}"
            x = linear(b, self.weights, x, layer, current, width_out)
            if index < len(widths) - 1:
                x = b.op("Relu", [x], f"{layer}.relu")
            current = width_out
        return b.op("Identity", [x], output)
