"""`convert_bert`: one BERT safetensors directory in, one ONNX file out; plus its content cache key.

It wires config, weights, encoder and head together and writes the file atomically. It needs only
`onnx` and numpy: never torch, and never onnxruntime (the caller loads the result).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import attrs
import onnx

from sie.worker.convert.bert_config import load_bert_config
from sie.worker.convert.bert_graph import build_encoder, graph_inputs
from sie.worker.convert.bert_weights import BertWeights
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder
from sie.worker.convert.heads import HEADS, HeadContext
from sie.worker.convert.safetensors_io import SafetensorsFile

# Bump whenever the emitted graph changes, so content-keyed caches rebuild.
CONVERTER_VERSION = "sie-bert-onnx/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# protobuf cannot serialise a message over 2 GiB; bigger models keep their tensors in a side file.
PROTOBUF_LIMIT = 2**31 - 1
_HASH_CHUNK = 1 << 20


@attrs.frozen
class ConversionResult:
    """Where the graph was written and what it produces."""

    path: Path
    head: str
    output_names: tuple[str, ...]
    labels: tuple[str, ...] = ()  # `id2label` in id order, for the classification heads


def convert_bert(model_dir: Path, out_path: Path, head: str) -> ConversionResult:
    """Convert `model_dir` (config.json + model.safetensors) into an opset-17 ONNX graph with `head`."""
    if head not in HEADS:
        raise ConversionError(f"unknown head {head!r}; expected one of {sorted(HEADS)}", source=str(model_dir))
    model_dir, out_path = Path(model_dir), Path(out_path)
    config = load_bert_config(model_dir / CONFIG_FILE)
    weights = BertWeights(SafetensorsFile(model_dir / WEIGHTS_FILE))
    builder = GraphBuilder()
    encoder = build_encoder(builder, config, weights)
    outputs = HEADS[head].build(HeadContext(builder, config, weights, encoder))
    model = builder.model(f"bert_{head}", graph_inputs(), outputs)
    save_graph(model, out_path)
    return ConversionResult(path=out_path, head=head, output_names=tuple(o.name for o in outputs), labels=config.labels)


def conversion_cache_key(model_dir: Path, head: str) -> str:
    """sha256 over converter version, head, config.json bytes and model.safetensors bytes."""
    digest = hashlib.sha256()
    for part in (CONVERTER_VERSION.encode(), head.encode()):
        digest.update(len(part).to_bytes(8, "little") + part)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        path = Path(model_dir) / name
        try:
            digest.update(path.stat().st_size.to_bytes(8, "little"))
            with path.open("rb") as handle:
                while chunk := handle.read(_HASH_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            raise ConversionError(f"cannot read file: {exc}", source=str(path)) from exc
    return digest.hexdigest()


def save_graph(model: onnx.ModelProto, out_path: Path) -> None:
    """Write via a temporary name and rename, so a reader never sees a half-written graph file."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    data_file = out_path.with_name(out_path.name + ".data")
    external = sum(len(t.raw_data) for t in model.graph.initializer) > PROTOBUF_LIMIT
    if external:
        data_file.unlink(missing_ok=True)  # onnx appends to an existing data file
    else:
        onnx.checker.check_model(model)
    try:
        onnx.save_model(
            model, partial, save_as_external_data=external, all_tensors_to_one_file=True, location=data_file.name
        )
        os.replace(partial, out_path)
    except OSError as exc:
        raise ConversionError(f"cannot write the converted graph: {exc}", source=str(out_path)) from exc
    finally:
        partial.unlink(missing_ok=True)
