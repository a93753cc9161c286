"""`GraphBuilder`: a thin layer over `onnx.helper` that names nodes, stores initializers and emits a model; and
`save_graph`, which writes a model atomically (its tensors in a side file when they are large).

It knows ONNX, not any model family. Small constants (shapes, axes, scalars) are shared by value, so a graph
holds one copy of each however many layers use it.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.names import side_file

OPSET = 17
# onnxruntime's contrib operators (fused Attention, RotaryEmbedding), on CPU and CUDA alike.
CONTRIB_DOMAIN = "com.microsoft"
# IR 8 is the oldest IR that opset 17 allows; it keeps the file loadable by older onnxruntime builds.
IR_VERSION = 8
PRODUCER = "sie.worker.convert"
# Tensors past this size go to a side file (`model.onnx.data`): protobuf cannot serialise a message over 2 GiB, and
# below that, serialising the weights into the graph copies them (a 1.1 GB Gemma 3 graph: ~4 s and 2.3 GB more peak
# memory to convert, and onnxruntime takes twice as long to load it). Small graphs stay one file.
SIDE_FILE_BYTES = 128 * 1024 * 1024


class GraphBuilder:
    """Collects nodes and initializers for one graph; every method returns the name of a tensor."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        # The model `model` emits, its initializers made in place as they are stored: a finished TensorProto added
        # to a graph is copied (about 2 s per GB of weights), and so is a graph added to a model.
        self._model: onnx.ModelProto | None = onnx.ModelProto(ir_version=IR_VERSION, producer_name=PRODUCER)
        self._used: Counter[str] = Counter()
        self._constants: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def unique(self, hint: str) -> str:
        self._used[hint] += 1
        count = self._used[hint]
        return hint if count == 1 else f"{hint}_{count}"

    def weight(self, name: str, array: np.ndarray, dtype: type[np.floating] = np.float32) -> str:
        """Store a parameter under `name` (made unique) as `dtype` (float32 unless a float16 graph asks) and
        return its name."""
        return self._store(name, np.asarray(array, dtype=dtype))

    def const(self, values: Any, dtype: type[np.generic] = np.int64) -> str:
        """A small constant (shape, axes or scalar), stored once per distinct value."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self._store(f"const_{len(self._constants)}", array)
        return self._constants[key]

    def _store(self, name: str, array: np.ndarray) -> str:
        # As numpy_helper.from_array makes a numeric tensor: its bytes in C order whatever the array's layout
        # (np.ascontiguousarray would be wrong here, it turns 0-d scalars into shape [1]), little-endian.
        tensor_name = self.unique(name)
        tensor = self._emitting().graph.initializer.add()
        tensor.name = tensor_name
        tensor.dims.extend(array.shape)
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.raw_data = numpy_helper.tobytes_little_endian(array)
        return tensor_name

    def _emitting(self) -> onnx.ModelProto:
        if self._model is None:
            raise RuntimeError("this GraphBuilder has emitted its model; a builder makes one graph")
        return self._model

    def op(self, op_type: str, inputs: Sequence[str], name: str, **attrs: Any) -> str:
        """Add one single-output node; its output tensor is called `name` (made unique)."""
        output = self.unique(name)
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=output, **attrs))
        return output

    def op_multi(self, op_type: str, inputs: Sequence[str], names: Sequence[str], **attrs: Any) -> list[str]:
        outputs = [self.unique(name) for name in names]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=outputs[0], **attrs))
        return outputs

    def branch(self, name: str, build: Callable[[], str]) -> onnx.GraphProto:
        """A subgraph for a control-flow node (`If`'s `then_branch`/`else_branch`): the nodes `build` adds, which
        may read any tensor of the graph around it, with `build`'s returned tensor as its one float output. Its
        weights and constants are the model's own."""
        return self.subgraph(name, [], lambda: [build()])

    def subgraph(
        self, name: str, inputs: Sequence[onnx.ValueInfoProto], build: Callable[[], list[str]]
    ) -> onnx.GraphProto:
        """A subgraph with inputs of its own (a `Scan` body: its state and one slice of each scanned tensor) and
        `build`'s returned tensors as its float outputs; the nodes `build` adds may read the inputs by name and
        any tensor of the graph around it."""
        outer, self.nodes = self.nodes, []
        try:
            outputs = build()
            nodes = self.nodes
        finally:
            self.nodes = outer
        declared = [helper.make_tensor_value_info(output, TensorProto.FLOAT, None) for output in outputs]
        return helper.make_graph(nodes, self.unique(name), list(inputs), declared)

    def model(
        self, graph_name: str, inputs: Sequence[onnx.ValueInfoProto], outputs: Sequence[onnx.ValueInfoProto]
    ) -> onnx.ModelProto:
        """The graph as a model, which holds the builder's initializers; the builder is done after it."""
        model = self._emitting()
        model.opset_import.extend([helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB_DOMAIN, 1)])
        graph = model.graph
        graph.name = graph_name
        graph.node.extend(self.nodes)
        graph.input.extend(inputs)
        graph.output.extend(outputs)
        self._model = None
        return model


def tensor_info(name: str, elem_type: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    """A graph input/output declaration; string dims are symbolic (`batch`, `sequence`)."""
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def save_graph(model: onnx.ModelProto, out_path: Path) -> None:
    """Write via a temporary name and rename, so a reader never sees a half-written graph file."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    data_file = side_file(out_path)
    external = sum(_tensor_bytes(tensor) for tensor in model.graph.initializer) > SIDE_FILE_BYTES
    try:
        if external:
            data_file.unlink(missing_ok=True)  # onnx appends to an existing data file
            onnx.save_model(model, partial, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_file.name)  # fmt: skip
            onnx.checker.check_model(str(partial))  # reads the graph, not the side file's tensors
        else:
            serialized = model.SerializeToString()  # once, for the checker and the file (a second costs ~2 s/GB)
            onnx.checker.check_model(serialized)
            partial.write_bytes(serialized)
        os.replace(partial, out_path)
    except OSError as exc:
        raise ConversionError(f"cannot write the converted graph: {exc}", source=str(out_path)) from exc
    finally:
        partial.unlink(missing_ok=True)


def _tensor_bytes(tensor: TensorProto) -> int:
    """A tensor's data size from its shape and type: reading `raw_data` would copy the bytes, and protobuf's
    `ByteSize` serialises the message to count them."""
    return math.prod(tensor.dims) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
