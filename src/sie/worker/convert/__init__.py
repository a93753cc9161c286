"""Torch-free conversion of checkpoints to ONNX graphs (DESIGN §6), one module per family (config + weights +
graph): BERT safetensors to encoder graphs (`bert`, entry point `encoders.convert_bert`) and llama GGUF files to
decoder graphs with a key/value cache plus their tokenizer (`llama`, entry point `decoders.convert_gguf`). Shared
pieces sit beside them: `heads`, `graph_builder`, `safetensors_io`, `gguf_io`, `gguf_tokenizer`, `errors`.

Public surface: `convert_bert`, the `HEADS` it can attach, `conversion_cache_key` for content-keyed caches,
`ConversionResult`; `convert_gguf`, `gguf_cache_key`, `DecoderConversion` and the decoder's input/output names;
`ConversionError`. It imports `onnx`, numpy, `tokenizers` and `gguf`, never onnxruntime.
"""

from sie.worker.convert.decoders import (
    CONFIG_FILE,
    GGUF_CONVERTER_VERSION,
    GRAPH_FILE,
    DecoderConversion,
    convert_gguf,
    gguf_cache_key,
)
from sie.worker.convert.encoders import (
    CONVERTER_VERSION,
    ConversionResult,
    conversion_cache_key,
    convert_bert,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from sie.worker.convert.heads import HEADS, Head
from sie.worker.convert.llama import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    POSITION_IDS,
    PRECISIONS,
    past_key_name,
    past_value_name,
    present_key_name,
    present_value_name,
)

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
    "convert_bert",
    "convert_gguf",
    "gguf_cache_key",
    "past_key_name",
    "past_value_name",
    "present_key_name",
    "present_value_name",
]
