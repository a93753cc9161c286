"""The content keys converted models are cached under, and the converter versions inside them. A key changes with
the checkpoint's bytes, the head or precision asked for and the converter's version, so a loader finds an earlier
conversion without converting, or importing `onnx`: this module imports neither `onnx` nor `gguf`.

Bump a version whenever its converter's output changes, so content-keyed caches rebuild: CONVERTER_VERSION for
`encoders.convert_encoder` (the graph), GGUF_CONVERTER_VERSION for `decoders.convert_gguf` (the graph, tokenizer or
config.json), DECODER_CONVERTER_VERSION for `decoders.convert_decoder_checkpoint` and `convert_decoder_hidden`,
OPEN_CLIP_CONVERTER_VERSION for `open_clip.convert_open_clip` (the files beside its graphs).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.names import (
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    GLINER_CONFIG_FILE,
    GLIREL_CONFIG_FILE,
    OPEN_CLIP_CONFIG_FILE,
    SPECIAL_TOKENS_MAP_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
)
from sie.worker.convert.safetensors_io import checkpoint_files, open_clip_weights_file

# 2: the BERT-like families (RoBERTa, XLM-R, ELECTRA, DistilBERT, MPNet), ModernBERT, sharded checkpoints
# 3: the BERT-like families' attention and residual norms as onnxruntime's fused contrib operators
# 4: the zero-shot heads (GLiNER spans scored one width at a time, GLiClass)
# 5: the CLIP and SigLIP text towers' attention as the fused contrib operator
# 6: DeBERTa's position terms over the window of relative positions a sequence reaches, not all of them
# 7: the BERT-like families' sequence classifiers compute the last layer for the first token only; 8: DeBERTa's too
# 9: GLiClass (first-token text pooling, marker label pooling) computes the last layer at those tokens only
# 10: ModernBERT's too (its `cls`-pooled classifiers, GLiClass on it); 11: CLIP's vision tower at its class token
# 12: the rotary families' Q, K and V as three projections, rotated by onnxruntime's fused RotaryEmbedding;
# ModernBERT's gated MLP as two products; 13: each residual + LayerNorm as an Add and a LayerNormalization, not the
# slower fused SkipLayerNormalization; 14: GLiNER's span scores with the queries folded through out_project's second
# layer while that is the cheaper side (fewer queries than 4/3 of the width); 15: and only while there are no
# more queries than words (the folded queries then take no more memory than a width's spans)
CONVERTER_VERSION = "sie-encoder-onnx/15"
# 2: logits of the last position only; 3: config.json in the decoder graph's terms (model_type, sie_graph);
# 4: a file's rope_freqs factors applied (Llama 3.1's RoPE scaling; before, they were left out); llama.cpp's
# end-of-generation tokens in config.json's eos_token_id
GGUF_CONVERTER_VERSION: Final = "sie-llama-onnx/4"
# 2: a config's `is_causal: false` attends both ways (before, gte-Qwen2-7B-instruct converted causal); 3: Qwen3.5,
# its config.json naming its linear-attention layers' state shapes
DECODER_CONVERTER_VERSION: Final = "sie-decoder-onnx/3"
# 2: open_clip's image order (resize in the image's mode, then RGB) in the converted preprocessor_config.json
OPEN_CLIP_CONVERTER_VERSION: Final = "sie-open-clip/2"
_HASH_CHUNK = 1 << 20


def conversion_cache_key(model_dir: Path, head: str) -> str:
    """sha256 over converter version, head, and the bytes of config.json (and a GLiNER checkpoint's
    gliner_config.json) and of every checkpoint file (the single model.safetensors, or the shard index and its
    shards)."""
    return _checkpoint_key(model_dir, CONVERTER_VERSION, head)


def decoder_cache_key(model_dir: Path, graph: str, precision: str) -> str:
    """As `conversion_cache_key`, for a decoder checkpoint's `graph` (`generate`, `hidden`, `hidden-bidirectional`) in
    `precision`; generation_config.json counts too (its end-of-sequence ids go into the converted config.json)."""
    extra = [Path(model_dir) / GENERATION_CONFIG_FILE] if graph == "generate" else []
    return _checkpoint_key(model_dir, DECODER_CONVERTER_VERSION, f"{graph}/{precision}", extra)


def open_clip_cache_key(model_dir: Path, tokenizer_dir: Path, precision: str = "float32") -> str:
    """As `conversion_cache_key`, for an open_clip checkpoint converted to a directory (`open_clip.py`) in
    `precision`: its open_clip_config.json, its weights and the tokenizer files the directory's tokenizer is made
    from."""
    digest = hashlib.sha256()
    variant = [] if precision == "float32" else [precision.encode()]  # float32 keeps its key from before float16
    for part in (CONVERTER_VERSION.encode(), OPEN_CLIP_CONVERTER_VERSION.encode(), *variant):
        digest.update(len(part).to_bytes(8, "little") + part)
    weights = open_clip_weights_file(model_dir)
    if weights is None:
        raise ConversionError("not an open_clip checkpoint", source=str(model_dir))
    _hash_file(digest, Path(model_dir) / OPEN_CLIP_CONFIG_FILE)
    _hash_file(digest, weights)
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE):
        path = Path(tokenizer_dir) / name
        digest.update(name.encode() + (b"+" if path.is_file() else b"-"))
        if path.is_file():
            _hash_file(digest, path)
    return digest.hexdigest()


def _checkpoint_key(model_dir: Path, version: str, variant: str, extra: list[Path] | None = None) -> str:
    digest = hashlib.sha256()
    for part in (version.encode(), variant.encode()):
        digest.update(len(part).to_bytes(8, "little") + part)
    configs = [Path(model_dir) / name for name in (CONFIG_FILE, GLINER_CONFIG_FILE, GLIREL_CONFIG_FILE)]
    for path in [config for config in configs if config.is_file()] or configs[:1]:
        _hash_file(digest, path)  # a missing config.json fails here, naming it
    for path in [*checkpoint_files(model_dir), *(path for path in extra or () if path.is_file())]:
        _hash_file(digest, path)
    return digest.hexdigest()


def _hash_file(digest: hashlib._Hash, path: Path) -> None:
    """Add a file's size and bytes to `digest`."""
    try:
        digest.update(path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise ConversionError(f"cannot read file: {exc}", source=str(path)) from exc


def gguf_cache_key(gguf_path: Path, precision: str) -> str:
    """sha256 over converter version, precision and the GGUF file's bytes."""
    digest = hashlib.sha256()
    for part in (GGUF_CONVERTER_VERSION.encode(), precision.encode()):
        digest.update(len(part).to_bytes(8, "little") + part)
    try:
        with Path(gguf_path).open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    except OSError as exc:
        raise ConversionError(f"cannot read file: {exc}", source=str(gguf_path)) from exc
    return digest.hexdigest()
