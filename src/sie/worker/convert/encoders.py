"""The encoder entry point, `convert_encoder`: one checkpoint directory of an encoder family (the BERT-like ones of
`families.py`, ModernBERT of `modernbert.py`, GTE and NomicBERT of `rotary_glu.py`, DeBERTa-v2/v3 of `deberta.py`)
in, one ONNX file out with the head asked for. Its cache key and version are in `cache_keys`.

It wires a family's config, weights and encoder graph (`encoder_graph.py`) to a head (`heads.py`) and writes the
file atomically. It needs only `onnx` and numpy: never torch, and never onnxruntime (the caller loads the result).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sie.worker.convert.deberta import DebertaConfig, build_deberta, parse_deberta_config
from sie.worker.convert.encoder_graph import EncoderWeights, build_encoder, graph_inputs
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import EncoderConfig, parse_encoder_config, read_config_json
from sie.worker.convert.graph_builder import GraphBuilder, save_graph
from sie.worker.convert.heads import HEADS, HeadContext
from sie.worker.convert.modernbert import ModernBertConfig, build_modernbert, parse_modernbert_config
from sie.worker.convert.names import CONFIG_FILE
from sie.worker.convert.rotary_glu import (
    ROTARY_GLU_MODEL_TYPES,
    RotaryGluConfig,
    build_rotary_glu,
    parse_rotary_glu_config,
)
from sie.worker.convert.safetensors_io import Checkpoint


@attrs.frozen
class ConversionResult:
    """Where the graph was written and what it produces."""

    path: Path
    head: str
    output_names: tuple[str, ...]
    labels: tuple[str, ...] = ()  # `id2label` in id order, for the classification heads


def convert_encoder(model_dir: Path, out_path: Path, head: str) -> ConversionResult:
    """Convert `model_dir` (config.json + model.safetensors, or its shards) into an opset-17 ONNX graph with
    `head`."""
    if head not in HEADS:
        raise ConversionError(f"unknown head {head!r}; expected one of {sorted(HEADS)}", source=str(model_dir))
    model_dir, out_path = Path(model_dir), Path(out_path)
    config_path = model_dir / CONFIG_FILE
    raw = read_config_json(config_path)
    config: EncoderConfig | ModernBertConfig | RotaryGluConfig | DebertaConfig
    if raw.get("model_type") == "modernbert":
        config = parse_modernbert_config(raw, str(config_path))
    elif raw.get("model_type") == "deberta-v2":
        config = parse_deberta_config(raw, str(config_path))
    elif raw.get("model_type") in ROTARY_GLU_MODEL_TYPES:
        config = parse_rotary_glu_config(raw, str(config_path))
    else:
        config = parse_encoder_config(raw, source=str(config_path))
    weights = EncoderWeights(Checkpoint(model_dir), config)
    builder = GraphBuilder()
    if isinstance(config, ModernBertConfig):
        encoder = build_modernbert(builder, config, weights)
    elif isinstance(config, DebertaConfig):
        encoder = build_deberta(builder, config, weights)
    elif isinstance(config, RotaryGluConfig):
        encoder = build_rotary_glu(builder, config, weights)
    else:
        encoder = build_encoder(builder, config, weights)
    outputs = HEADS[head].build(HeadContext(builder, config, weights, encoder))
    model = builder.model(f"{config.family.name}_{head}", graph_inputs(), outputs)
    save_graph(model, out_path)
    return ConversionResult(path=out_path, head=head, output_names=tuple(o.name for o in outputs), labels=config.labels)
