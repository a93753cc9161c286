"""The decoder entry point, `convert_gguf`: one llama GGUF file in, one directory out holding the decoder graph
with its key/value cache (`model.onnx`), the rebuilt tokenizer (`tokenizer.json`, `tokenizer_config.json` with the
chat template) and the `config.json` the causal-LM adapter reads. Its cache key and version are in `cache_keys`.

It wires a family's config, weights and decoder graph (`llama.py`) to the GGUF reader and tokenizer. Like
`convert_encoder` it needs only `onnx`, numpy, `tokenizers` and the pure-Python `gguf` reader: never torch, llama.cpp
or onnxruntime (the caller loads the result).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import attrs

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import GgufFile
from sie.worker.convert.gguf_tokenizer import gguf_tokenizer
from sie.worker.convert.graph_builder import GraphBuilder, save_graph
from sie.worker.convert.llama import (
    LlamaConfig,
    LlamaWeights,
    build_decoder,
    decoder_inputs,
    decoder_outputs,
    llama_config,
    precision_named,
)
from sie.worker.convert.names import CONFIG_FILE, GRAPH_FILE


@attrs.frozen
class DecoderConversion:
    """Where a converted decoder was written, its architecture and the precision of its weights and cache."""

    directory: Path
    config: LlamaConfig
    precision: str

    @property
    def graph(self) -> Path:
        return self.directory / GRAPH_FILE


def convert_gguf(
    gguf_path: Path, out_dir: Path, precision: str = "float32", on_progress: Callable[[int, int], None] | None = None
) -> DecoderConversion:
    """Convert `gguf_path` into `out_dir` (created); `on_progress(done, total)` counts the tensor bytes read."""
    chosen = precision_named(precision)
    out_dir = Path(out_dir)
    gguf = GgufFile(gguf_path, on_read=on_progress)
    config = llama_config(gguf)
    tokenizer = gguf_tokenizer(gguf, config.max_position_embeddings)
    builder = GraphBuilder()
    build_decoder(builder, config, LlamaWeights(gguf, config), chosen)
    model = builder.model("llama_decoder", decoder_inputs(config, chosen), decoder_outputs(config, chosen))
    del builder  # its initializers now belong to `model`: keep one copy of the weights in memory, not two
    save_graph(model, out_dir / GRAPH_FILE)
    tokenizer.save(out_dir)
    config_json = json.dumps(config.to_json(tokenizer.special_ids, chosen.name), indent=2)
    try:
        (out_dir / CONFIG_FILE).write_text(config_json + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConversionError(f"cannot write {CONFIG_FILE}: {exc}", source=str(out_dir)) from exc
    return DecoderConversion(out_dir, config, chosen.name)
