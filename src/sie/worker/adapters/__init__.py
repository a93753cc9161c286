"""ONNX adapters by module name: this project's `sie.adapters.*` and the public SIE names they serve.

A model profile's `adapter_path` is `module:Class`; only the module part selects the adapter here,
so public SIE YAMLs (e.g. `sie_server.adapters.sentence_transformer:…`) run unchanged.
"""

from __future__ import annotations

from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult
from sie.worker.adapters.cross_encoder import CrossEncoderAdapter
from sie.worker.adapters.dense import DenseAdapter
from sie.worker.adapters.multivector import MultivectorAdapter
from sie.worker.adapters.sparse import SpladeAdapter
from sie.worker.adapters.token_classification import TokenClassificationAdapter
from sie.worker.errors import ModelLoadError

ADAPTERS: dict[str, type[Adapter]] = {
    "sie.adapters.dense": DenseAdapter,
    "sie.adapters.sparse": SpladeAdapter,
    "sie.adapters.multivector": MultivectorAdapter,
    "sie.adapters.cross_encoder": CrossEncoderAdapter,
    "sie.adapters.token_classification": TokenClassificationAdapter,
    # public SIE module names served by the adapters above
    "sie_server.adapters.sentence_transformer": DenseAdapter,
    "sie_server.adapters.bert_flash": DenseAdapter,
    "sie_server.adapters.pytorch_embedding": DenseAdapter,
    "sie_server.adapters.splade_flash": SpladeAdapter,
    "sie_server.adapters.splade_flash.adapter": SpladeAdapter,
    "sie_server.adapters.cross_encoder": CrossEncoderAdapter,
    "sie_server.adapters.bert_flash_cross_encoder": CrossEncoderAdapter,
    "sie_server.adapters.colbert": MultivectorAdapter,
}

# The ONNX head a safetensors checkpoint is converted with, per adapter.
CONVERSION_HEADS: dict[type[Adapter], str] = {
    DenseAdapter: "none",
    MultivectorAdapter: "none",
    SpladeAdapter: "mlm-splade",
    CrossEncoderAdapter: "seq-cls",
    TokenClassificationAdapter: "token-cls",
}


def adapter_class(adapter_path: str | None) -> type[Adapter]:
    """The adapter for `module:Class`; an unknown module is a DEPENDENCY load failure."""
    module = (adapter_path or "").split(":", 1)[0]
    adapter = ADAPTERS.get(module)
    if adapter is None:
        raise ModelLoadError("DEPENDENCY", f"unknown adapter module {module!r}; this worker runs {sorted(ADAPTERS)}")
    return adapter


__all__ = [
    "ADAPTERS",
    "CONVERSION_HEADS",
    "Adapter",
    "AdapterContext",
    "BatchResult",
    "ItemResult",
    "adapter_class",
]
