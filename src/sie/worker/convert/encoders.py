"""The encoder entry point, `convert_bert`: one BERT safetensors directory in, one ONNX file out with the head asked
for; plus its content cache key.

It wires a family's config, weights and encoder graph (`bert.py`) to a head (`heads.py`) and writes the file
atomically. It needs only `onnx` and numpy: never torch, and never onnxruntime (the caller loads the result).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs

from sie.worker.convert.bert import BertWeights, build_encoder, graph_inputs, load_bert_config
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder, save_graph
from sie.worker.convert.heads import HEADS, HeadContext
from sie.worker.convert.safetensors_io import SafetensorsFile

# Bump whenever the emitted graph changes, so content-keyed caches rebuild.
CONVERTER_VERSION = "sie-bert-onnx/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
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
