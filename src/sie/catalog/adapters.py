"""Adapter kinds: which kind of model an `adapter_path` names, by its module part.

A profile's `adapter_path` is `module:Class`; the module selects the kind (the class only where one public module
serves two kinds: `ADAPTER_CLASS_KINDS`), so public SIE YAMLs
(`sie_server.adapters.sentence_transformer:…`) name the same kinds as this project's `sie.adapters.*`.
The worker maps each kind to the class that runs it; the gateway reads the kind to check a request's
options before anything is queued (`sie.catalog.options`).
"""

from __future__ import annotations

from typing import Final

DENSE: Final = "dense"
SPARSE: Final = "sparse"
MULTIVECTOR: Final = "multivector"
HYBRID: Final = "hybrid"  # dense, sparse and multi-vector from one forward pass (BGE-M3)
CROSS_ENCODER: Final = "cross_encoder"
TOKEN_CLASSIFICATION: Final = "token_classification"
CAUSAL_LM: Final = "causal_lm"
CAUSAL_RERANKER: Final = "causal_reranker"  # a decoder scoring pairs from its "yes"/"no" logits (Qwen3-Reranker)
GLINER: Final = "gliner"  # zero-shot entity spans for the labels each request names
NLI_CLASSIFICATION: Final = "nli_classification"  # zero-shot classification by entailment, labels per request
GLICLASS: Final = "gliclass"  # zero-shot classification reading the labels with the text (GLiClass)
IMAGE_TEXT: Final = "image_text"  # texts and images in one space (CLIP, SigLIP)
GLIREL: Final = "glirel"  # zero-shot relations between the entities each item names, for the labels each request names
GLINER2: Final = "gliner2"  # GLiNER2 span models: entities, or classifications of a task, for each request's labels
CONTEXT_PRUNER: Final = "context_pruner"  # a cross-encoder with a token head keeping or pruning a passage's spans
GLINER_UNION: Final = "gliner_union"  # the union of several GLiNER models' spans, read in word windows
GLINER2_DECIDE: Final = "gliner2_decide"  # GLiNER2.5-Decide: typed questions and label groups, answered in one row

ADAPTER_KINDS: Final[dict[str, str]] = {
    "sie.adapters.dense": DENSE,
    "sie.adapters.sparse": SPARSE,
    "sie.adapters.multivector": MULTIVECTOR,
    "sie.adapters.hybrid": HYBRID,
    "sie.adapters.cross_encoder": CROSS_ENCODER,
    "sie.adapters.token_classification": TOKEN_CLASSIFICATION,
    "sie.adapters.causal_lm": CAUSAL_LM,
    "sie.adapters.causal_reranker": CAUSAL_RERANKER,
    "sie.adapters.gliner": GLINER,
    "sie.adapters.nli_classification": NLI_CLASSIFICATION,
    "sie.adapters.gliclass": GLICLASS,
    "sie.adapters.glirel": GLIREL,
    "sie.adapters.gliner_union": GLINER_UNION,
    "sie.adapters.gliner2": GLINER2,
    "sie.adapters.gliner2_decide": GLINER2_DECIDE,
    "sie.adapters.image_text": IMAGE_TEXT,
    # public SIE module names served by the kinds above
    "sie_server.adapters.sentence_transformer": DENSE,
    "sie_server.adapters.bert_flash": DENSE,
    "sie_server.adapters.xlm_roberta_flash": DENSE,
    "sie_server.adapters.modernbert_flash": DENSE,
    "sie_server.adapters.rope_flash": DENSE,
    "sie_server.adapters.nomic_flash": DENSE,  # nomic-embed-text-v2-moe: NomicBERT with experts (rotary_glu.py)
    "sie_server.adapters.pytorch_embedding": DENSE,
    # decoder embedders (Qwen3-Embedding, gte-Qwen2, e5-mistral, …): a decoder checkpoint converts to its hidden
    # states, which the dense adapter pools (last token or mean)
    "sie_server.adapters.qwen2_flash": DENSE,
    "sie_server.adapters.sglang.embedding": DENSE,
    "sie_server.adapters.splade_flash": SPARSE,
    "sie_server.adapters.splade_flash.adapter": SPARSE,
    "sie_server.adapters.gte_sparse_flash": SPARSE,
    "sie_server.adapters.cross_encoder": CROSS_ENCODER,
    "sie_server.adapters.bert_flash_cross_encoder": CROSS_ENCODER,
    "sie_server.adapters.jina_flash_cross_encoder": CROSS_ENCODER,  # jina-reranker-v2: XLM-R (convert/jina_flash.py)
    "sie_server.adapters.modernbert_flash_cross_encoder": CROSS_ENCODER,
    "sie_server.adapters.qwen2_flash_cross_encoder.adapter": CAUSAL_RERANKER,
    "sie_server.adapters.native_causal_cross_encoder.adapter": CAUSAL_RERANKER,  # zerank: its raw positive logit
    # stablebridge: bge-reranker-v2-m3 scoring, its pruning head (a file of its own) keeping a passage's spans
    "sie_server.adapters.stablebridge_pruner": CONTEXT_PRUNER,
    # Qwen3-VL-Reranker, text pairs only: its chat template's prompt, sigmoid(yes − no)
    "sie_server.adapters.qwen3_vl_reranker.adapter": CAUSAL_RERANKER,
    "sie_server.adapters.colbert": MULTIVECTOR,
    "sie_server.adapters.colbert_modernbert_flash.adapter": MULTIVECTOR,
    "sie_server.adapters.colbert_rotary_flash": MULTIVECTOR,  # jina-colbert-v2: rotary flash XLM-R (jina_flash.py)
    # TopK-Embed: a Qwen3.5 language model attending both ways, each token's state projected by its `head.weight`;
    # text queries and documents (page images are not served: the vision tower is not built)
    "sie_server.adapters.topk_embed.adapter": MULTIVECTOR,
    # Qwen3-VL-Embedding: its Qwen3 language model, each text written into its chat template (text only; images and
    # video are not served)
    "sie_server.adapters.qwen3_vl_embedding": DENSE,
    "sie_server.adapters.bge_m3_flash": HYBRID,
    "sie_server.adapters.bge_m3": HYBRID,
    "sie_server.adapters.bge_m3_flag": HYBRID,
    # generation of the decoder families the converter builds; a checkpoint of another architecture fails its load
    # naming it
    "sie_server.adapters.sglang.generation": CAUSAL_LM,
    "sie_server.adapters.sglang.gemma": CAUSAL_LM,
    # GLiNER2 (fastino gliner2) span checkpoints: entities and classification (a boundary checkpoint, GLiNER2.5, fails
    # its load naming it; relations and structured output are refused per request)
    "sie_server.adapters.gliner2.adapter": GLINER2,
    "sie_server.adapters.gliner2.classification": GLINER2,
    "sie_server.adapters.gliner2.entities": GLINER2,
    # GLiNER2.5-Decide span checkpoints (a boundary one fails its load naming it)
    "sie_server.adapters.gliner2.decide": GLINER2_DECIDE,
    # GLiNER span models; a checkpoint of another GLiNER architecture (token-level, bi-encoder, relations) fails its
    # load naming it
    "sie_server.adapters.gliner": GLINER,
    "sie_server.adapters.gliner_bi": GLINER,  # bi-encoders: labels read by an encoder of their own
    # several GLiNER models (each any architecture the gliner kind serves) as one, their spans unioned
    "sie_server.adapters.gliner_union.adapter": GLINER_UNION,
    # NLI models (DeBERTa-v3, ModernBERT, ... with an entailment head) classifying by hypothesis
    "sie_server.adapters.nli_classification_flash": NLI_CLASSIFICATION,
    "sie_server.adapters.nli_classification": NLI_CLASSIFICATION,
    # GLiClass uni-encoders; another GLiClass architecture (bi-encoder, encoder-decoder) fails its load naming it
    "sie_server.adapters.gliclass": GLICLASS,
    # GLiREL relation extraction over the entities an item's metadata names
    "sie_server.adapters.glirel": GLIREL,
    # CLIP and SigLIP image–text embedders (transformers checkpoints, and open_clip's SigLIP layout)
    "sie_server.adapters.clip": IMAGE_TEXT,
    "sie_server.adapters.siglip.adapter": IMAGE_TEXT,
    # the public Rust engine's embedding module serves many encoder architectures; ours converts the checkpoint,
    # and one whose model_type it does not build fails that load naming it
    "sie_server_rust.adapters.candle": DENSE,
}


# Public modules whose recipe runs a decoder attending both ways (its full-attention layers; the public adapter sets
# `is_causal = False`), as a profile's `forward_kwargs: {is_causal: false}` asks.
BIDIRECTIONAL_MODULES: Final = frozenset({"sie_server.adapters.topk_embed.adapter"})


# Public modules of architectures SIE does not build, with what they are: a model naming one is refused saying so.
_NOT_BUILT = "which SIE does not build"
UNSERVED_MODULES: Final[dict[str, str]] = {
    "sie_server.adapters.gliformer.adapter": f"GLiFormer multi-task extraction, {_NOT_BUILT}",
}


# Where one public module serves several kinds, the class decides (`module:Class`, before the module's kind).
ADAPTER_CLASS_KINDS: Final[dict[str, str]] = {
    "sie_server.adapters.sentence_transformer:SentenceTransformerSparseAdapter": SPARSE,
}


def adapter_module(adapter_path: str | None) -> str:
    """The module part of `module:Class` ("" for none)."""
    return (adapter_path or "").split(":", 1)[0]


def unserved_reason(adapter_path: str | None) -> str:
    """Why a model whose profiles name `adapter_path` runs nowhere: what the module is when SIE knows it, else that no
    bundle runs it."""
    module = adapter_module(adapter_path)
    what = UNSERVED_MODULES.get(module)
    return f"its adapter {module!r} is {what}" if what else f"no bundle runs its adapter module {module!r}"


def adapter_kind(adapter_path: str | None) -> str | None:
    """The kind of model `adapter_path` runs, or None for a module SIE does not serve."""
    return ADAPTER_CLASS_KINDS.get(adapter_path or "") or ADAPTER_KINDS.get(adapter_module(adapter_path))
