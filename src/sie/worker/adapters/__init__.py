"""ONNX adapters by kind of model: a profile's `adapter_path` names a kind (`sie.catalog.adapters`, where
public SIE module names map too, so their YAMLs run unchanged) and the kind selects the class here.
"""

from __future__ import annotations

from pathlib import Path

from sie.catalog.adapters import ADAPTER_KINDS, adapter_kind, adapter_module
from sie.worker.adapters.base import Adapter, AdapterContext, BatchResult, ItemResult
from sie.worker.adapters.causal_lm import CausalLMAdapter, GenerationInputError, PreparedGeneration
from sie.worker.adapters.causal_reranker import CausalRerankerAdapter
from sie.worker.adapters.context_pruner import ContextPrunerAdapter
from sie.worker.adapters.cross_encoder import CrossEncoderAdapter
from sie.worker.adapters.dense import DenseAdapter
from sie.worker.adapters.gliclass import GliclassAdapter
from sie.worker.adapters.gliner import GlinerAdapter
from sie.worker.adapters.gliner2 import Gliner2Adapter
from sie.worker.adapters.gliner2_decide import Gliner2DecideAdapter
from sie.worker.adapters.gliner_union import GlinerUnionAdapter
from sie.worker.adapters.glirel import GlirelAdapter
from sie.worker.adapters.hybrid import HybridAdapter
from sie.worker.adapters.image_text import ImageTextAdapter
from sie.worker.adapters.multivector import MultivectorAdapter
from sie.worker.adapters.nli_classification import NliClassificationAdapter
from sie.worker.adapters.sparse import SpladeAdapter, read_splade_stack
from sie.worker.adapters.token_classification import TokenClassificationAdapter
from sie.worker.convert.names import (
    CLIP_HEAD,
    GLICLASS_HEAD,
    GLINER2_HEAD,
    GLINER_HEAD,
    GLIREL_HEAD,
    SEQ_CLS_WITH_STATES,
)
from sie.worker.errors import ModelLoadError

# The class that runs each kind of model (`sie.catalog.adapters` maps adapter modules to kinds).
ADAPTERS: dict[str, type[Adapter]] = {
    adapter.kind: adapter
    for adapter in (
        DenseAdapter,
        SpladeAdapter,
        MultivectorAdapter,
        HybridAdapter,
        CrossEncoderAdapter,
        ContextPrunerAdapter,
        TokenClassificationAdapter,
        GlinerAdapter,
        GlinerUnionAdapter,
        Gliner2Adapter,
        Gliner2DecideAdapter,
        NliClassificationAdapter,
        GliclassAdapter,
        GlirelAdapter,
        ImageTextAdapter,
        CausalLMAdapter,
        CausalRerankerAdapter,
    )
    if adapter.kind is not None
}

# The ONNX head a safetensors checkpoint is converted with, per adapter.
CONVERSION_HEADS: dict[type[Adapter], str] = {
    DenseAdapter: "none",
    MultivectorAdapter: "none",
    HybridAdapter: "none",
    SpladeAdapter: "mlm-splade",
    CrossEncoderAdapter: "seq-cls",
    ContextPrunerAdapter: SEQ_CLS_WITH_STATES,  # the logits and every token's state, which its pruning head reads
    TokenClassificationAdapter: "token-cls",
    CausalRerankerAdapter: "none",  # a decoder checkpoint converts to its hidden states
    NliClassificationAdapter: "seq-cls",
    GlinerAdapter: GLINER_HEAD,
    Gliner2Adapter: GLINER2_HEAD,  # a GLiNER2 span checkpoint converts to its span, count and class outputs
    Gliner2DecideAdapter: GLINER2_HEAD,  # and a GLiNER2.5-Decide one, read for its class outputs
    GliclassAdapter: GLICLASS_HEAD,  # a GLiClass checkpoint converts to its label logits (convert/gliclass.py)
    GlirelAdapter: GLIREL_HEAD,  # a GLiREL checkpoint converts to its relation scores (convert/glirel.py)
    ImageTextAdapter: CLIP_HEAD,  # a CLIP or SigLIP checkpoint converts to its two towers (convert/clip.py)
}


def conversion_head(adapter: type[Adapter], model_dir: Path) -> str:
    """The ONNX head a safetensors checkpoint in `model_dir` is converted with for `adapter`: CONVERSION_HEADS's,
    but a SPLADE stack that pools by sum gets a summing head (sparse.py)."""
    if adapter is SpladeAdapter:
        try:
            return read_splade_stack(model_dir).conversion_head
        except ValueError as exc:
            raise ModelLoadError("UNKNOWN", str(exc)) from exc
    return CONVERSION_HEADS[adapter]


def adapter_class(adapter_path: str | None) -> type[Adapter]:
    """The adapter for `module:Class`; an unknown module is a DEPENDENCY load failure."""
    kind = adapter_kind(adapter_path)
    if kind is None:
        known = sorted(ADAPTER_KINDS)
        raise ModelLoadError("DEPENDENCY", f"unknown adapter module {adapter_module(adapter_path)!r}; known: {known}")
    return ADAPTERS[kind]


__all__ = [
    "ADAPTERS",
    "CONVERSION_HEADS",
    "conversion_head",
    "Adapter",
    "AdapterContext",
    "BatchResult",
    "CausalLMAdapter",
    "GenerationInputError",
    "GlinerUnionAdapter",
    "ItemResult",
    "PreparedGeneration",
    "adapter_class",
]
