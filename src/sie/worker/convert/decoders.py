"""The decoder entry points. `convert_gguf`: one GGUF file (llama, qwen2, qwen3, gemma3) in, one directory out holding
the decoder graph with its key/value cache (`model.onnx`), the rebuilt tokenizer (`tokenizer.json`,
`tokenizer_config.json` with the chat template) and the `config.json` the causal-LM adapter reads.
`convert_decoder_checkpoint`: a transformers checkpoint of a decoder family (`decoder_families`) in, the same directory
out but for the tokenizer, which stays with the checkpoint. `convert_decoder_hidden`: the same checkpoint to one graph
of its last hidden states, which the embedding and reranker adapters pool (causal, or both ways for an embedding
recipe that asks for it). Their cache keys and versions are in
`cache_keys`.

They wire a source's config and weights (`gguf_decoders.py` for GGUF, `decoder_families.py` for checkpoints) to the
decoder graph (`decoder_graph.py`). Like `convert_encoder` they need only `onnx`, numpy, `tokenizers` and the
pure-Python `gguf` reader: never torch, llama.cpp or onnxruntime (the caller loads the result).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import attrs

from sie.worker.convert.decoder_families import attending_both_ways, checkpoint_weights, parse_decoder_config
from sie.worker.convert.decoder_graph import (
    HIDDEN_STATE,
    DecoderConfig,
    DecoderShape,
    DecoderWeights,
    Precision,
    build_decoder,
    decoder_inputs,
    decoder_outputs,
    precision_named,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_decoders import gguf_config, gguf_weights
from sie.worker.convert.gguf_io import GgufFile
from sie.worker.convert.gguf_tokenizer import gguf_tokenizer
from sie.worker.convert.graph_builder import GraphBuilder, save_graph
from sie.worker.convert.latent_attention import build_latent_attention, parse_latent_attention_config
from sie.worker.convert.names import CONFIG_FILE, GENERATION_CONFIG_FILE, GRAPH_FILE, NVEMBED_MODEL_TYPE
from sie.worker.convert.safetensors_io import Checkpoint, read_json

# The special token ids a checkpoint's config.json carries, copied into the converted one.
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


@attrs.frozen
class DecoderConversion:
    """Where a converted decoder was written, its architecture and the precision of its weights and cache."""

    directory: Path
    config: DecoderConfig
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
    config = gguf_config(gguf)
    tokenizer = gguf_tokenizer(gguf, config.max_position_embeddings)
    _write_graph(config, gguf_weights(gguf, config), chosen, DecoderShape.GENERATE, out_dir / GRAPH_FILE)
    tokenizer.save(out_dir)
    _write_config(out_dir, config.to_json(tokenizer.special_ids, chosen.name, DecoderShape.GENERATE))
    return DecoderConversion(out_dir, config, chosen.name)


def convert_decoder_checkpoint(model_dir: Path, out_dir: Path, precision: str = "float32") -> DecoderConversion:
    """Convert the checkpoint in `model_dir` into a generation graph and its `config.json` in `out_dir` (created).
    The special token ids come from the checkpoint's config.json, the end-of-sequence ids of its
    generation_config.json joined to them (a model that ends a chat turn with its own token lists both)."""
    chosen = precision_named(precision)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    raw = read_json(model_dir / CONFIG_FILE)
    config = parse_decoder_config(raw, str(model_dir / CONFIG_FILE))
    _write_graph(config, checkpoint_weights(Checkpoint(model_dir), config), chosen, DecoderShape.GENERATE,
                 out_dir / GRAPH_FILE)  # fmt: skip
    # A Gemma 3 with a vision tower may name them in its text_config alone.
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    special = {key: value for key in SPECIAL_ID_KEYS if (value := raw.get(key, text.get(key))) is not None}
    if (model_dir / GENERATION_CONFIG_FILE).is_file():
        generation = read_json(model_dir / GENERATION_CONFIG_FILE)
        ends = [*_ids(special.get("eos_token_id")), *_ids(generation.get("eos_token_id"))]
        if ends:
            special["eos_token_id"] = sorted(set(ends))
    _write_config(out_dir, config.to_json(special, chosen.name, DecoderShape.GENERATE))
    return DecoderConversion(out_dir, config, chosen.name)


def convert_decoder_hidden(
    model_dir: Path, out_path: Path, precision: str = "float32", bidirectional: bool = False
) -> DecoderConfig:
    """Convert the checkpoint in `model_dir` into one graph of its last hidden states at `out_path`; `bidirectional`
    makes every token see every other whatever the config says (a recipe that embeds with `is_causal=False`). An
    NV-Embed checkpoint's states are its latent-attention block's, after its decoder."""
    model_dir = Path(model_dir)
    raw = read_json(model_dir / CONFIG_FILE)
    config = parse_decoder_config(raw, str(model_dir / CONFIG_FILE))
    if bidirectional:
        config = attending_both_ways(config)
    checkpoint = Checkpoint(model_dir)
    weights = checkpoint_weights(checkpoint, config)
    chosen = precision_named(precision)
    if raw.get("model_type") != NVEMBED_MODEL_TYPE:
        _write_graph(config, weights, chosen, DecoderShape.HIDDEN, Path(out_path))
        return config
    # NV-Embed: the decoder's states through its latent-attention block (`latent_attention`)
    latent = parse_latent_attention_config(raw, config.hidden_size, str(model_dir / CONFIG_FILE))
    builder = GraphBuilder()
    hidden = build_decoder(builder, config, weights, chosen, DecoderShape.HIDDEN, "embedding_model.last_hidden_state")
    build_latent_attention(builder, latent, checkpoint, chosen, hidden, HIDDEN_STATE)
    model = builder.model(f"{NVEMBED_MODEL_TYPE}_decoder", decoder_inputs(config, chosen, DecoderShape.HIDDEN),
                          decoder_outputs(config, chosen, DecoderShape.HIDDEN))  # fmt: skip
    save_graph(model, Path(out_path))
    return config


def _ids(value: object) -> list[int]:
    """A config's token id field (one id or a list) as a list of ids."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def _write_graph(
    config: DecoderConfig, weights: DecoderWeights, precision: Precision, shape: DecoderShape, path: Path
) -> None:
    builder = GraphBuilder()
    build_decoder(builder, config, weights, precision, shape)
    model = builder.model(f"{config.model_type}_decoder", decoder_inputs(config, precision, shape),
                          decoder_outputs(config, precision, shape))  # fmt: skip
    save_graph(model, path)


def _write_config(out_dir: Path, config_json: dict) -> None:
    try:
        (out_dir / CONFIG_FILE).write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConversionError(f"cannot write {CONFIG_FILE}: {exc}", source=str(out_dir)) from exc
