"""Torch-free conversion of BERT-family safetensors checkpoints to ONNX graphs (DESIGN §6).

Public surface: `convert_bert`, the `HEADS` it can attach, `conversion_cache_key` for content-keyed
caches, `ConversionResult` and `ConversionError`. It imports `onnx` and numpy, never onnxruntime.
"""

from sie.worker.convert.converter import (
    CONVERTER_VERSION,
    ConversionResult,
    conversion_cache_key,
    convert_bert,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.heads import HEADS, Head

__all__ = [
    "CONVERTER_VERSION",
    "HEADS",
    "ConversionError",
    "ConversionResult",
    "Head",
    "conversion_cache_key",
    "convert_bert",
]
