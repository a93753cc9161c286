"""Torch-free conversion of checkpoints to ONNX graphs (DESIGN §6): safetensors checkpoints of the encoder families
(BERT, RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA, DistilBERT, MPNet: `families` says how they differ, `encoder_graph`
builds them; ModernBERT: `modernbert`; DeBERTa-v2/v3: `deberta`; entry point `encoders.convert_encoder`) and decoders
(`decoder_graph`) from GGUF files of llama, qwen2, qwen3 and gemma3 (`gguf_decoders`, entry point
`decoders.convert_gguf`, which rebuilds the tokenizer too) and from Llama, Mistral, Qwen2, Qwen3, Granite and Gemma 3
checkpoints (`decoder_families`, entry points `decoders.convert_decoder_checkpoint` for generation and
`decoders.convert_decoder_hidden` for embeddings and rerankers). Shared pieces sit beside them: `heads`,
`graph_builder`, `safetensors_io`, `gguf_io`, `gguf_tokenizer` (with `gguf_sentencepiece`), `errors`, the `names` a
converted graph and directory use, and the `cache_keys` conversions are stored under. A family built like BERT is one
more entry in `families`, a decoder like Llama one more row in `decoder_families`; another architecture is one more
module beside `encoder_graph.py`/`modernbert.py`/`decoder_graph.py`, wired in by its entry point.

Public surface: `convert_encoder`, the `HEADS` it can attach, `conversion_cache_key` for content-keyed caches,
`ConversionResult`; `convert_gguf`, `gguf_cache_key`, `DecoderConversion` and the decoder's input/output names;
`ConversionError`. The converter imports `onnx`, numpy, `tokenizers` and `gguf`, never onnxruntime. Importing this
package loads neither `onnx` nor `gguf`: the attributes that need them (`convert_encoder`, `convert_gguf`, `HEADS`,
...) load their module on first use, so a worker whose models are all converted already never pays for `onnx`'s
start-up (about 1.4 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sie.worker.convert.cache_keys import (
    CONVERTER_VERSION,
    GGUF_CONVERTER_VERSION,
    conversion_cache_key,
    gguf_cache_key,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.names import (
    ATTENTION_MASK,
    CONFIG_FILE,
    GRAPH_FILE,
    INPUT_IDS,
    LOGITS,
    POSITION_IDS,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    past_key_name,
    past_value_name,
    present_key_name,
    present_value_name,
)

if TYPE_CHECKING:
    from sie.worker.convert.decoder_graph import PRECISIONS
    from sie.worker.convert.decoders import (
        DecoderConversion,
        convert_decoder_checkpoint,
        convert_decoder_hidden,
        convert_gguf,
    )
    from sie.worker.convert.encoders import ConversionResult, convert_encoder
    from sie.worker.convert.heads import HEADS, Head

# The public names that import `onnx`, by the module that defines them.
_LOADED_ON_USE = {
    "ConversionResult": "encoders",
    "convert_encoder": "encoders",
    "DecoderConversion": "decoders",
    "convert_gguf": "decoders",
    "convert_decoder_checkpoint": "decoders",
    "convert_decoder_hidden": "decoders",
    "HEADS": "heads",
    "Head": "heads",
    "PRECISIONS": "decoder_graph",
}


def __getattr__(name: str) -> Any:
    """Load a converter attribute's module on first use (PEP 562)."""
    module = _LOADED_ON_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ATTENTION_MASK",
    "CONFIG_FILE",
    "CONVERTER_VERSION",
    "GGUF_CONVERTER_VERSION",
    "GRAPH_FILE",
    "HEADS",
    "INPUT_IDS",
    "LOGITS",
    "POSITION_IDS",
    "PRECISIONS",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "ConversionError",
    "ConversionResult",
    "DecoderConversion",
    "Head",
    "conversion_cache_key",
    "convert_decoder_checkpoint",
    "convert_decoder_hidden",
    "convert_encoder",
    "convert_gguf",
    "gguf_cache_key",
    "past_key_name",
    "past_value_name",
    "present_key_name",
    "present_value_name",
]
