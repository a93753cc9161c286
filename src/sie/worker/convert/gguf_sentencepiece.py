"""The SentencePiece vocabulary a GGUF file carries (`tokenizer.ggml.model = llama`: tokens, scores and token types,
no merges), rebuilt as a `tokenizers` BPE model with byte fallback through the `<0xNN>` tokens, unknown pieces fused
and merges recovered from the vocabulary. `gguf_tokenizer` adds the special tokens, the BOS template and the chat
template around it.

Two shapes are rebuilt exactly, by architecture:
- Gemma 3 (`gemma3`): no prefix space, spaces normalised to "▁", merges ranked by the merged piece's place in the
  file (Gemma's scores do not follow its merge order): the shape of Gemma's own tokenizer.json.
- Llama 2, Mistral and the other `llama`-architecture SentencePiece models: merges ranked by score, as SentencePiece
  merges, and a "▁" prefixed to every run of text, as llama.cpp tokenizes (a space prefix at the start and after
  each special or added token, unless the file sets `add_space_prefix` false); decoding drops the leading space.
Another SentencePiece file (a precompiled normaliser, an appended <eos>, another architecture) is a ConversionError,
never an approximate tokenizer.
"""

from __future__ import annotations

from typing import Final

import attrs
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED, GgufFile

SPACE: Final = "\u2581"  # "▁", SentencePiece's spelling of a space
GEMMA_ARCHITECTURES: Final = frozenset({"gemma3"})
LLAMA_ARCHITECTURES: Final = frozenset({"llama"})


@attrs.frozen
class SentencePieceShape:
    """How a file's SentencePiece vocabulary tokenizes: whether every run of text gets a "▁" prefix, and whether the
    merges follow the scores (SentencePiece's own order) or the file order (Gemma's)."""

    prefix_space: bool
    merges_by_score: bool


def sentencepiece_shape(gguf: GgufFile) -> SentencePieceShape:
    """The shape of the file's SentencePiece tokenizer; ConversionError where it is not one rebuilt exactly."""
    source, arch = str(gguf.path), gguf.architecture
    if gguf.value("tokenizer.ggml.precompiled_charsmap", None) is not None:
        raise ConversionError("a SentencePiece tokenizer with a precompiled normaliser is not supported", source=source)
    if gguf.value("tokenizer.ggml.add_eos_token", False):
        raise ConversionError("a SentencePiece tokenizer that appends <eos> is not supported", source=source)
    # llama.cpp adds a prefix space to a SentencePiece text unless the file says not to
    prefix_space = bool(gguf.value("tokenizer.ggml.add_space_prefix", True))
    if arch in GEMMA_ARCHITECTURES:
        if prefix_space:
            raise ConversionError("a Gemma SentencePiece tokenizer that adds a prefix space is not supported",
                                  source=source)  # fmt: skip
        return SentencePieceShape(prefix_space=False, merges_by_score=False)
    if arch in LLAMA_ARCHITECTURES:
        return SentencePieceShape(prefix_space=prefix_space, merges_by_score=True)
    known = sorted(GEMMA_ARCHITECTURES | LLAMA_ARCHITECTURES)
    raise ConversionError(f"a SentencePiece tokenizer ('llama') is rebuilt for architectures {known} only, "
                          f"not {arch!r}", source=source)  # fmt: skip


def sentencepiece_vocabulary(tokens: list[str], token_types: list[int]) -> tuple[list[str], list[int]]:
    """The vocabulary as the SentencePiece model spells it. llama.cpp's converter writes a user-defined piece with
    real spaces for its "▁" (Gemma's runs of 2 to 31 spaces); spelled back, such a piece is plain vocabulary that
    the merges reach, as in Gemma's tokenizer.json (an added token is matched before the normaliser turns spaces
    into "▁", so it would never meet one)."""
    spelled, types = [], []
    for token, token_type in zip(tokens, token_types, strict=True):
        respelled = token_type == TOKEN_TYPE_USER_DEFINED and " " in token
        spelled.append(token.replace(" ", SPACE) if respelled else token)
        types.append(TOKEN_TYPE_NORMAL if respelled else token_type)
    return spelled, types


def recovered_merges(tokens: list[str], scores: list[float] | None = None) -> list[tuple[str, str]]:
    """Every cut of a token into two tokens of the vocabulary. Without scores, ranked by the merged token's place in
    the file (SentencePiece lists its pieces best first; Gemma's scores do not follow that order), the cuts of one
    token longest left piece first, as Hugging Face's SentencePiece conversion ranks them. With scores, best score
    first as SentencePiece merges, ties by the longer left then the longer right piece, then file order (the same
    conversion's ranking)."""
    vocabulary = set(tokens)
    cuts = [
        (index, token[:cut], token[cut:])
        for index, token in enumerate(tokens)
        for cut in range(len(token) - 1, 0, -1)
        if token[:cut] in vocabulary and token[cut:] in vocabulary
    ]
    if scores is not None:
        cuts.sort(key=lambda cut: (-scores[cut[0]], -len(cut[1]), -len(cut[2])))  # stable: file order on ties
    return [(left, right) for _, left, right in cuts]


def sentencepiece_model(
    tokens: list[str], scores: list[float] | None, unknown: str | None, shape: SentencePieceShape
) -> Tokenizer:
    """The BPE model over `tokens` (file order is id order) with the normaliser, pre-tokenizer and decoder of
    `shape`; `scores` rank the merges (None: the file order, Gemma's)."""
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=recovered_merges(tokens, scores),
        unk_token=unknown,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(bpe)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if shape.merges_by_score:
        # Llama 2's own tokenizer.json: every run of text between added tokens gets its "▁" (the normaliser runs on
        # each run), as llama.cpp prefixes a space at the start and after each special token, even to a text that
        # starts with one (`Metaspace` would not add it there); SentencePiece's decode drops the one it added.
        replace = normalizers.Replace(" ", SPACE)
        tokenizer.normalizer = (
            normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if shape.prefix_space else replace
        )
        if shape.prefix_space:
            steps.append(decoders.Strip(content=" ", left=1, right=0))
    else:
        tokenizer.normalizer = normalizers.Replace(" ", SPACE)
        # Gemma's tokenizer.json splits at spaces after the normaliser has replaced them all, so a text reaches the
        # model whole: kept so that the rebuilt tokenizer.json reads as Gemma's does.
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer
