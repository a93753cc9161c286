"""The encoder entry point, `convert_encoder`: one checkpoint directory of an encoder family (the BERT-like ones of
`families.py`, ModernBERT of `modernbert.py`, GTE and NomicBERT of `rotary_glu.py`, DeBERTa-v2/v3 of `deberta.py`,
BART's sequence classifier of `bart.py`)
in, one ONNX file out with the head asked for. Its cache key and version are in `cache_keys`.

It wires a family's config, weights and encoder graph (`encoder_graph.py`) to a head (`heads.py`) and writes the
file atomically. It needs only `onnx` and numpy: never torch, and never onnxruntime (the caller loads the result).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from sie.worker.convert.bart import HEADS_BUILT as BART_HEADS
from sie.worker.convert.bart import BartConfig, build_bart, parse_bart_config
from sie.worker.convert.deberta import DebertaConfig, build_deberta, parse_deberta_config
from sie.worker.convert.encoder_graph import EncoderOutput, EncoderWeights, build_encoder, first_rows, graph_inputs
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import EncoderConfig, parse_encoder_config, read_config_json
from sie.worker.convert.graph_builder import GraphBuilder, save_graph
from sie.worker.convert.heads import HEADS, HeadContext, reads_first_token_only
from sie.worker.convert.jina_flash import FlashXlmRobertaTensors, as_known_config, is_flash_xlm_roberta, is_rotary
from sie.worker.convert.modernbert import ModernBertConfig, build_modernbert, parse_modernbert_config
from sie.worker.convert.names import CONFIG_FILE
from sie.worker.convert.rotary_glu import (
    ROTARY_GLU_MODEL_TYPES,
    RotaryGluConfig,
    build_rotary_glu,
    parse_rotary_glu_config,
)
from sie.worker.convert.safetensors_io import Checkpoint

BackboneConfig = EncoderConfig | ModernBertConfig | RotaryGluConfig | DebertaConfig | BartConfig


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
    flash = is_flash_xlm_roberta(raw)  # Jina's remote-code XLM-R (jina-reranker-v2, jina-colbert-v2): jina_flash.py
    config = parse_backbone_config(as_known_config(raw, str(config_path)) if flash else raw, str(config_path))
    if isinstance(config, BartConfig) and head not in BART_HEADS:
        raise ConversionError(f"head {head!r} is not built for BART (an encoder-decoder); built: {list(BART_HEADS)}",
                              source=str(model_dir))  # fmt: skip
    checkpoint = Checkpoint(model_dir)  # after the config, so what is wrong in it is named first
    weights = EncoderWeights(FlashXlmRobertaTensors(checkpoint, is_rotary(raw)) if flash else checkpoint, config)
    builder = GraphBuilder()
    rows = first_rows(builder) if reads_first_token_only(head, config) and computes_rows(config) else ""
    encoder = build_backbone(builder, config, weights, rows=rows)
    outputs = HEADS[head].build(HeadContext(builder, config, weights, encoder))
    model = builder.model(f"{config.family.name}_{head}", graph_inputs(), outputs)
    save_graph(model, out_path)
    return ConversionResult(path=out_path, head=head, output_names=tuple(o.name for o in outputs), labels=config.labels)


def parse_backbone_config(raw: dict[str, Any], source: str) -> BackboneConfig:
    """The config of any encoder family this converter builds, by its `model_type`; an unknown one names the
    supported ones."""
    model_type = raw.get("model_type")
    if model_type == "modernbert":
        return parse_modernbert_config(raw, source)
    if model_type == "deberta-v2":
        return parse_deberta_config(raw, source)
    if model_type == "bart":
        return parse_bart_config(raw, source)
    if model_type in ROTARY_GLU_MODEL_TYPES:
        return parse_rotary_glu_config(raw, source)
    return parse_encoder_config(raw, source=source)


def computes_rows(config: BackboneConfig) -> bool:
    """Whether `build_backbone` computes the last layer at given rows only for this family (BERT-like, DeBERTa,
    ModernBERT)."""
    return isinstance(config, EncoderConfig | DebertaConfig | ModernBertConfig)


def build_backbone(
    builder: GraphBuilder, config: BackboneConfig, weights: EncoderWeights, *, rows: str = ""
) -> EncoderOutput:
    """The encoder graph of `config`'s family, up to its last hidden state. `rows` (int64 [B, P] positions, where
    `computes_rows`): the head reads those tokens' states alone, so the last layer is computed there only, giving
    [B, P, H] (see `build_encoder`)."""
    if rows and not computes_rows(config):
        raise ValueError(f"{type(config).__name__} computes every token's last layer; rows are not built for it")
    if isinstance(config, ModernBertConfig):
        return build_modernbert(builder, config, weights, rows=rows)
    if isinstance(config, DebertaConfig):
        return build_deberta(builder, config, weights, rows=rows)
    if isinstance(config, BartConfig):
        return build_bart(builder, config, weights)
    if isinstance(config, RotaryGluConfig):
        return build_rotary_glu(builder, config, weights)
    return build_encoder(builder, config, weights, rows=rows)
