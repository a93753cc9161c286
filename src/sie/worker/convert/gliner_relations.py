"""A GLiNER relation-extraction model's relation graph ("relex": `relations_layer` set in gliner_config.json), beside
its span graph (`gliner.py`, which also puts out each row's word embeddings and relation-type embeddings): the
entity candidates the adapter picked (spans scored above the threshold) are represented as the span layer
represents them (`markerV0`), the relations layer scores every ordered pair of them as an adjacency, the pairs above
each row's adjacency threshold are kept (NonZero, so the graph holds only those), each pair's head and tail
representations are concatenated and projected (`pair_rep_layer`) and scored against each relation type's marker
embedding, through a sigmoid.

Read from the `gliner` package (`modeling/base.py` UniEncoderSpanRelexModel, `modeling/multitask/relations_layers.py`,
`modeling/utils.py` build_entity_pairs) and checked against it on random checkpoints
(tests/integration/test_gliner_relex.py). The adjacency of every relations layer gliner has is built: `none` (every
pair), `dot`, `mlp`, `attention`/`attn`, `bilinear`, `gcn`, `gat`. A knowledge-graph `triples_layer` fails the
conversion naming it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
from sie.worker.convert.head_layers import HeadWeights, gather_rows, linear, projection_mlp
from sie.worker.convert.names import (
    ADJACENCY_THRESHOLDS,
    ENTITY_MASK,
    ENTITY_SPANS,
    PAIR_INDEX,
    RELATION_EMBEDDINGS,
    RELATION_SCORES,
    WORD_EMBEDDINGS,
)

# gliner's relations layers (`RelationsRepLayer`; "none": every ordered pair, no adjacency layer).
RELATIONS_LAYERS = ("none", "dot", "mlp", "attention", "attn", "bilinear", "gcn", "gat")
ATTENTION_HEADS = 8  # RelationsRepLayer's nhead for `attention` and `gat` (gliner passes none of its own)
SPAN_LAYER = "span_rep_layer.span_rep_layer"
ADJACENCY = "relations_rep_layer.relation_rep_layer"
_FLOAT = TensorProto.FLOAT


def check_relations_layer(relations_layer: str, triples_layer: object, source: str) -> str:
    """The relations layer's name in lower case, or a ConversionError naming what is not built."""
    if triples_layer is not None:
        raise ConversionError(f"triples_layer {triples_layer!r} is set: a GLiNER relation model scoring "
                              "knowledge-graph triples, which SIE does not build (it builds pair_rep_layer scoring)",
                              source=source)  # fmt: skip
    mode = str(relations_layer).lower()
    if mode not in RELATIONS_LAYERS:
        raise ConversionError(f"relations_layer {relations_layer!r} is not built (supported: {list(RELATIONS_LAYERS)})",
                              source=source)  # fmt: skip
    return mode


def convert_relations(weights: HeadWeights, relations_layer: str, width: int, out_path: Path) -> None:
    """The relation graph: WORD_EMBEDDINGS [rows, words, width], ENTITY_SPANS [rows, entities, 2] (first and last
    word), ENTITY_MASK [rows, entities] (1 for a candidate, 0 for padding), RELATION_EMBEDDINGS [rows, types, width]
    and ADJACENCY_THRESHOLDS [rows] in; PAIR_INDEX [pairs, 3] (row, head entity, tail entity; row by row, head by head)
    and RELATION_SCORES [pairs, types] out."""
    b = GraphBuilder()
    graph = _RelationGraph(b, weights, width)
    entities = graph.entities()
    adjacency = graph.adjacency(entities, relations_layer)
    pairs, scores = graph.scored_pairs(entities, adjacency)
    inputs = [
        tensor_info(WORD_EMBEDDINGS, _FLOAT, ["rows", "words", width]),
        tensor_info(ENTITY_SPANS, TensorProto.INT64, ["rows", "entities", 2]),
        tensor_info(ENTITY_MASK, _FLOAT, ["rows", "entities"]),
        tensor_info(RELATION_EMBEDDINGS, _FLOAT, ["rows", "types", width]),
        tensor_info(ADJACENCY_THRESHOLDS, _FLOAT, ["rows"]),
    ]
    outputs = [
        tensor_info(pairs, TensorProto.INT64, ["pairs", 3]),
        tensor_info(scores, _FLOAT, ["pairs", "types"]),
    ]
    save_graph(b.model("gliner_relations", inputs, outputs), out_path)


class _RelationGraph:
    def __init__(self, builder: GraphBuilder, weights: HeadWeights, width: int) -> None:
        self.b = builder
        self.weights = weights
        self.width = width

    def entities(self) -> str:
        """Each candidate's span representation [B, E, D], as `SpanMarkerV0` makes it from its first and last word:
        both projected, concatenated, through a ReLU and projected again."""
        b, width = self.b, self.width
        ends = []
        for side, column in (("start", 0), ("end", 1)):
            index = b.op("Gather", [ENTITY_SPANS, b.const(column)], f"entities.{side}_word", axis=2)
            words = gather_rows(b, WORD_EMBEDDINGS, index, width, f"entities.{side}_words")
            ends.append(projection_mlp(b, self.weights, words, f"{SPAN_LAYER}.project_{side}", width, width))
        joined = b.op("Relu", [b.op("Concat", ends, "entities.joined", axis=2)], "entities.relu")
        return projection_mlp(b, self.weights, joined, f"{SPAN_LAYER}.out_project", 2 * width, width)

    def adjacency(self, entities: str, mode: str) -> str | None:
        """The relations layer's adjacency [B, E, E] over the candidates (padding's rows and columns zero); None for
        `none`, which keeps every pair."""
        b, width = self.b, self.width
        if mode == "none":
            return None
        if mode == "dot":
            return self._masked(self._self_similarity(entities, "adjacency.dot"))
        if mode == "bilinear":
            projected = linear(b, self.weights, entities, f"{ADJACENCY}.proj", width, width)
            return self._masked(self._self_similarity(projected, "adjacency.bilinear"))
        if mode == "mlp":
            return self._masked(self._mlp_adjacency(entities))
        if mode in ("attention", "attn"):
            weights, _ = self._attention(entities, with_values=False)
            return self._masked(weights)
        if mode == "gcn":
            return self._masked(self._gcn_adjacency(entities))
        _, attended = self._attention(entities, with_values=True)  # gat
        projected = linear(b, self.weights, attended, f"{ADJACENCY}.linear", width, width)
        return self._masked(self._self_similarity(projected, "adjacency.gat"))

    def scored_pairs(self, entities: str, adjacency: str | None) -> tuple[str, str]:
        """The ordered pairs of distinct candidates whose adjacency is above their row's threshold (every pair of
        candidates without an adjacency), as build_entity_pairs orders them, and their sigmoid scores against the
        row's relation types."""
        b, width = self.b, self.width
        mask = b.op("Cast", [ENTITY_MASK], "pairs.mask_bool", to=TensorProto.BOOL)
        heads_valid = b.op("Unsqueeze", [mask, b.const([2])], "pairs.head_valid")
        both = b.op("And", [heads_valid, b.op("Unsqueeze", [mask, b.const([1])], "pairs.tail_valid")],
                    "pairs.both_valid")  # fmt: skip
        count = b.op("Squeeze", [b.op("Shape", [ENTITY_MASK], "pairs.entity_count", start=1, end=2), b.const([0])],
                     "pairs.entities")  # fmt: skip
        index = b.op("Range", [b.const(0), count, b.const(1)], "pairs.index")
        same = b.op("Equal", [b.op("Unsqueeze", [index, b.const([1])], "pairs.index_col"),
                              b.op("Unsqueeze", [index, b.const([0])], "pairs.index_row")], "pairs.same")  # fmt: skip
        keep = b.op("And", [both, b.op("Not", [same], "pairs.distinct")], "pairs.valid")
        if adjacency is not None:
            thresholds = b.op("Unsqueeze", [ADJACENCY_THRESHOLDS, b.const([1, 2])], "pairs.thresholds")
            keep = b.op("And", [keep, b.op("Greater", [adjacency, thresholds], "pairs.adjacent")], "pairs.keep")
        pairs = b.op("Transpose", [b.op("NonZero", [keep], "pairs.nonzero")], PAIR_INDEX, perm=[1, 0])
        heads = b.op("GatherND", [entities, b.op("Gather", [pairs, b.const([0, 1])], "pairs.head_at", axis=1)],
                     "pairs.heads")  # fmt: skip
        tails = b.op("GatherND", [entities, b.op("Gather", [pairs, b.const([0, 2])], "pairs.tail_at", axis=1)],
                     "pairs.tails")  # fmt: skip
        joined = b.op("Concat", [heads, tails], "pairs.joined", axis=1)
        represented = projection_mlp(b, self.weights, joined, "pair_rep_layer", 2 * width, width)  # [N, D]
        # Each pair against every row's types, [N, B x C], then its own row's taken: no [N, C, D] tensor is held
        # (the adapter keeps N x B x C small; one row a run for the large ones).
        types = b.op("Reshape", [RELATION_EMBEDDINGS, b.const([-1, width])], "pairs.all_types")
        every = b.op("MatMul", [represented, b.op("Transpose", [types], "pairs.all_types_t", perm=[1, 0])],
                     "pairs.every_logit")  # fmt: skip
        grid = b.op("Concat", [b.const([0]), b.op("Shape", [RELATION_EMBEDDINGS], "pairs.rows_types", start=0, end=2)],
                    "pairs.grid_shape", axis=0)  # fmt: skip
        every = b.op("Reshape", [every, grid], "pairs.by_row")  # [N, B, C]
        rows = b.op("Gather", [pairs, b.const([0])], "pairs.row", axis=1)  # [N, 1]
        index_shape = b.op("Concat", [b.op("Shape", [rows], "pairs.count_shape"),
                                      b.op("Shape", [RELATION_EMBEDDINGS], "pairs.type_count", start=1, end=2)],
                           "pairs.index_shape", axis=0)  # fmt: skip
        index = b.op("Expand", [b.op("Unsqueeze", [rows, b.const([2])], "pairs.row_3d"), index_shape], "pairs.index")
        logits = b.op("GatherElements", [every, index], "pairs.own_row", axis=1)  # [N, 1, C]
        logits = b.op("Squeeze", [logits, b.const([1])], "pairs.logits")
        return pairs, b.op("Sigmoid", [logits], RELATION_SCORES)

    def _self_similarity(self, x: str, name: str) -> str:
        """sigmoid(x xᵀ): [B, E, E]."""
        b = self.b
        product = b.op("MatMul", [x, b.op("Transpose", [x], f"{name}.t", perm=[0, 2, 1])], f"{name}.product")
        return b.op("Sigmoid", [product], name)

    def _pair_mask(self) -> str:
        """mask_i × mask_j: [B, E, E]."""
        b = self.b
        return b.op("Mul", [b.op("Unsqueeze", [ENTITY_MASK, b.const([2])], "adjacency.mask_col"),
                            b.op("Unsqueeze", [ENTITY_MASK, b.const([1])], "adjacency.mask_row")],
                    "adjacency.pair_mask")  # fmt: skip

    def _masked(self, adjacency: str) -> str:
        return self.b.op("Mul", [adjacency, self._pair_mask()], "adjacency")

    def _mlp_adjacency(self, entities: str) -> str:
        """MLPDecoder: an MLP over [entity_i, entity_j] for every pair; its first layer applied to each half once per
        entity and summed per pair."""
        b, width = self.b, self.width
        first = self.weights.get(f"{ADJACENCY}.mlp.0.weight", (width, 2 * width))
        first_bias = self.weights.get(f"{ADJACENCY}.mlp.0.bias", (width,))
        heads = b.op("MatMul", [entities, b.weight("adjacency.mlp0.head", first[:, :width].T)], "adjacency.mlp_head")
        tails = b.op("MatMul", [entities, b.weight("adjacency.mlp0.tail", first[:, width:].T)], "adjacency.mlp_tail")
        summed = b.op("Add", [b.op("Unsqueeze", [heads, b.const([2])], "adjacency.mlp_head_4d"),
                              b.op("Unsqueeze", [tails, b.const([1])], "adjacency.mlp_tail_4d")],
                      "adjacency.mlp_sum")  # fmt: skip
        hidden = b.op("Relu", [b.op("Add", [summed, b.weight("adjacency.mlp0.bias", first_bias)],
                                    "adjacency.mlp_biased")], "adjacency.mlp_relu")  # fmt: skip
        logits = linear(b, self.weights, hidden, f"{ADJACENCY}.mlp.2", width, 1)
        return b.op("Sigmoid", [b.op("Squeeze", [logits, b.const([3])], "adjacency.mlp_logits")], "adjacency.mlp")

    def _gcn_adjacency(self, entities: str) -> str:
        """GCNDecoder: the dot adjacency with self-loops on the candidates, symmetrically normalised, propagates the
        entities through one GCN layer; the adjacency of their projections."""
        b, width = self.b, self.width
        pair_mask = self._pair_mask()
        first = b.op("Mul", [self._self_similarity(entities, "gcn.dot"), pair_mask], "gcn.dot_masked")
        loops = b.op("Mul", [b.op("EyeLike", [b.op("Gather", [first, b.const(0)], "gcn.one_row", axis=0)],
                                  "gcn.eye"),
                             b.op("Unsqueeze", [ENTITY_MASK, b.const([2])], "gcn.mask_col")], "gcn.loops")  # fmt: skip
        looped = b.op("Add", [b.op("Mul", [first, pair_mask], "gcn.masked_again"), loops], "gcn.looped")
        degree = b.op("Max", [b.op("ReduceSum", [looped, b.const([2])], "gcn.degree_raw", keepdims=0),
                              b.const(1e-6, np.float32)], "gcn.degree")  # fmt: skip
        scale = b.op("Pow", [degree, b.const(-0.5, np.float32)], "gcn.scale")
        rows_scaled = b.op("Mul", [looped, b.op("Unsqueeze", [scale, b.const([2])], "gcn.scale_col")],
                           "gcn.row_scaled")  # fmt: skip
        normalised = b.op("Mul", [rows_scaled, b.op("Unsqueeze", [scale, b.const([1])], "gcn.scale_row")],
                          "gcn.normalised")  # fmt: skip
        propagated = b.op("MatMul", [normalised, entities], "gcn.propagated")
        hidden = b.op("Relu", [linear(b, self.weights, propagated, f"{ADJACENCY}.gcn.linear", width, width)],
                      "gcn.hidden")  # fmt: skip
        projected = linear(b, self.weights, hidden, f"{ADJACENCY}.proj", width, width)
        return self._self_similarity(projected, "adjacency.gcn")

    def _attention(self, entities: str, with_values: bool) -> tuple[str, str | None]:
        """torch's MultiheadAttention of the candidates over themselves, padding masked as keys: the attention
        weights averaged over the heads [B, E, E], and (`with_values`) its output [B, E, D]."""
        b, width = self.b, self.width
        if width % ATTENTION_HEADS:
            raise ConversionError(f"the relations layer's attention needs a width divisible by {ATTENTION_HEADS}, "
                                  f"not {width}")  # fmt: skip
        head = width // ATTENTION_HEADS
        in_weight = self.weights.get(f"{ADJACENCY}.attn.in_proj_weight", (3 * width, width))
        in_bias = self.weights.get(f"{ADJACENCY}.attn.in_proj_bias", (3 * width,))
        projected = []
        for part, name in enumerate(("query", "key", "value")[: 3 if with_values else 2]):
            rows = slice(part * width, (part + 1) * width)
            x = b.op("MatMul", [entities, b.weight(f"attn.{name}.weight", in_weight[rows].T)], f"attn.{name}.matmul")
            x = b.op("Add", [x, b.weight(f"attn.{name}.bias", in_bias[rows])], f"attn.{name}")
            heads = b.op("Reshape", [x, b.const([0, 0, ATTENTION_HEADS, head])], f"attn.{name}.heads")
            projected.append(b.op("Transpose", [heads], f"attn.{name}.bhed", perm=[0, 2, 1, 3]))  # [B, H, E, d]
        keys_t = b.op("Transpose", [projected[1]], "attn.key_t", perm=[0, 1, 3, 2])
        scores = b.op("Mul", [b.op("MatMul", [projected[0], keys_t], "attn.product"),
                              b.const(1.0 / math.sqrt(head), np.float32)], "attn.scaled")  # fmt: skip
        padding = b.op("Mul", [b.op("Sub", [b.const(1.0, np.float32), ENTITY_MASK], "attn.padding"),
                               b.const(-1e30, np.float32)], "attn.padding_bias")  # fmt: skip
        scores = b.op("Add", [scores, b.op("Unsqueeze", [padding, b.const([1, 2])], "attn.padding_4d")],
                      "attn.masked")  # fmt: skip
        weights = b.op("Softmax", [scores], "attn.weights", axis=3)
        averaged = b.op("ReduceMean", [weights], "attn.averaged", axes=[1], keepdims=0)
        if not with_values:
            return averaged, None
        attended = b.op("MatMul", [weights, projected[2]], "attn.attended")  # [B, H, E, d]
        merged = b.op("Reshape", [b.op("Transpose", [attended], "attn.behd", perm=[0, 2, 1, 3]),
                                  b.const([0, 0, width])], "attn.merged")  # fmt: skip
        return averaged, linear(b, self.weights, merged, f"{ADJACENCY}.attn.out_proj", width, width)
