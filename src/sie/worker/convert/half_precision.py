"""Half precision for a converted float32 encoder graph, for a CUDA profile whose `compute_precision` is float16 or
bfloat16: the matrix products (MatMul, Gemm, Conv and onnxruntime's fused Attention) run in float16 over float16
weights, and everything else stays float32: the residual stream, LayerNorm, the Softmax of the unfused attentions,
pooling, normalisation and the graph's outputs. On CUDA the products accumulate in float32 (cuBLAS's default for
float16), and so do the fused attention's softmax and the norms, so what float16 changes is the rounding of each
product's operands and result.

A tensor the products read is cast to float16 once, however many products read it (a layer's input feeds its query,
key and value projections), and a product's result is cast back to float32 only where something else reads it. A
weight that only products read is stored in float16 alone: half the file and half the memory. Control-flow
subgraphs (GLiNER's `If`) are converted the same way and read the outer graph's float16 tensors and weights.

It knows ONNX, not any model family: every family's graph is built in float32 and passed through here
(`worker/loading.py` does it when the loader's device is a GPU and the profile asks).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sie.worker.convert.graph_builder import CONTRIB_DOMAIN, save_graph

# The operators computed in float16: which of their inputs and which of their outputs are the float tensors they
# compute on (the fused Attention's mask index, input 3, is int32 and stays as it is).
HALF_OPERATORS: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...]]] = {
    ("", "MatMul"): ((0, 1), (0,)),
    ("", "Gemm"): ((0, 1, 2), (0,)),
    ("", "Conv"): ((0, 1, 2), (0,)),
    (CONTRIB_DOMAIN, "Attention"): ((0, 1, 2, 4, 5), (0, 1)),
}
SUFFIX = ".float16"


def products_in_half_file(path: Path) -> None:
    """Rewrite the float32 graph file at `path` (and its side file of weights, if it has one) with its products in
    float16."""
    model = onnx.load(str(path))
    products_in_half(model)
    save_graph(model, path)


def products_in_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert `model` in place (and return it): its products in float16, the rest float32 (module docstring)."""
    graph = model.graph
    rewrite = _Rewrite(graph)
    rewrite.graph(graph, ChainMap())
    rewrite.drop_unread()
    return model


class _Rewrite:
    """One model's conversion: the float16 copies of its weights and the names in use."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.top = graph
        self.weights = {tensor.name: tensor for tensor in graph.initializer}
        self.names = set(self.weights) | {value.name for value in graph.input}
        for node in _nodes(graph):
            self.names.update(node.output)

    def unique(self, hint: str) -> str:
        name, count = hint, 1
        while name in self.names:
            count += 1
            name = f"{hint}_{count}"
        self.names.add(name)
        return name

    def graph(self, graph: onnx.GraphProto, halves: ChainMap[str, str]) -> None:
        """Rewrite `graph`'s nodes in order. `halves` maps a float32 tensor to its float16 twin where one exists (in
        this graph or a graph around it)."""
        rewritten: list[onnx.NodeProto] = []
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    self.graph(attribute.g, halves.new_child())
            kind = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
            if kind not in HALF_OPERATORS:
                rewritten.append(node)
                continue
            inputs, outputs = HALF_OPERATORS[kind]
            for index in inputs:
                if index < len(node.input) and node.input[index]:
                    node.input[index] = self._half_input(node.input[index], halves, rewritten)
            rewritten.append(node)
            for index in outputs:
                if index < len(node.output) and node.output[index]:
                    full = node.output[index]
                    half = node.output[index] = halves[full] = self.unique(full + SUFFIX)
                    back = self.unique(f"{full}.float32")
                    rewritten.append(helper.make_node("Cast", [half], [full], name=back, to=TensorProto.FLOAT))
        del graph.node[:]
        graph.node.extend(rewritten)

    def _half_input(self, name: str, halves: ChainMap[str, str], rewritten: list[onnx.NodeProto]) -> str:
        """The float16 twin of `name`: a float16 copy of a weight (in the top graph, shared by every reader), or a
        Cast added before its first float16 reader in this graph."""
        if name in halves:
            return halves[name]
        weight = self.weights.get(name)
        if weight is not None and weight.data_type == TensorProto.FLOAT:
            values = numpy_helper.to_array(weight).astype(np.float16)
            half = self.top.initializer.add()
            half.CopyFrom(numpy_helper.from_array(values, self.unique(name + SUFFIX)))
            halves.maps[-1][name] = half.name  # a weight's twin serves every graph: recorded at the outermost level
            return half.name
        half_name = self.unique(name + SUFFIX)
        rewritten.append(helper.make_node("Cast", [name], [half_name], name=half_name, to=TensorProto.FLOAT16))
        halves[name] = half_name
        return half_name

    def drop_unread(self) -> None:
        """Remove what nothing reads any more: a product's Cast back to float32 whose result only products read,
        and a float32 weight whose readers all read its float16 copy."""
        graphs = [self.top, *_subgraphs(self.top)]
        outputs = {value.name for graph in graphs for value in graph.output}
        read = {name for node in _nodes(self.top) for name in node.input} | outputs
        for graph in graphs:
            unread = [node for node in graph.node if _casts_to_float(node) and node.output[0] not in read]
            for node in unread:
                graph.node.remove(node)
        kept = [tensor for tensor in self.top.initializer if tensor.name in read]
        if len(kept) != len(self.top.initializer):
            del self.top.initializer[:]
            self.top.initializer.extend(kept)


def _casts_to_float(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT for a in node.attribute)


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield attribute.g
                yield from _subgraphs(attribute.g)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attribute.g)
