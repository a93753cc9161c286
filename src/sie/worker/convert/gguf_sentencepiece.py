"""The SentencePiece vocabulary a Gemma GGUF file carries (`tokenizer.ggml.model = llama`: tokens, scores and token
types, no merges), rebuilt as the `tokenizers` BPE model of Gemma's own tokenizer.json: spaces normalised to "▁", no
prefix space, byte fallback through the `<0xNN>` tokens, unknown pieces fused, merges recovered from the vocabulary.
`gguf_tokenizer` adds the special tokens, the BOS template and the chat template around it.

Only Gemma's shape is rebuilt (architecture `gemma3`, no prefix space, no precompiled normaliser): another
SentencePiece vocabulary (Llama 2's adds a prefix space and orders its merges by score) is a ConversionError, never
an approximate tokenizer.
"""

from __future__ import annotations

from typing import Final

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED, GgufFile

SPACE: Final = "\u2581"  # "▁", SentencePiece's spelling of a space
SENTENCEPIECE_ARCHITECTURES: Final = frozenset({"gemma3"})
# The token that closes a Gemma chat turn: llama.cpp ends a generation there (it finds it by its text), as Gemma's
# generation_config.json lists it beside <eos>.
END_OF_TURN: Final = "<end_of_turn>"


def check_sentencepiece(gguf: GgufFile) -> None:
    """ConversionError unless the file's SentencePiece tokenizer is Gemma's shape, which `sentencepiece_model`
    rebuilds exactly."""
    source, arch = str(gguf.path), gguf.architecture
    if arch not in SENTENCEPIECE_ARCHITECTURES:
        raise ConversionError(f"a SentencePiece tokenizer ('llama') is rebuilt for architectures "
                              f"{sorted(SENTENCEPIECE_ARCHITECTURES)} only, not {arch!r}", source=source)  # fmt: skip
    # llama.cpp adds a prefix space to a SentencePiece text unless the file says not to
    if gguf.value("tokenizer.ggml.add_space_prefix", True):
        raise ConversionError("a SentencePiece tokenizer that adds a prefix space is not supported", source=source)
    if gguf.value("tokenizer.ggml.precompiled_charsmap", None) is not None:
        raise ConversionError("a SentencePiece tokenizer with a precompiled normaliser is not supported", source=source)
    if gguf.value("tokenizer.ggml.add_eos_token", False):
        raise ConversionError("a SentencePiece tokenizer that appends <eos> is not supported", source=source)


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


def recovered_merges(tokens: list[str]) -> list[tuple[str, str]]:
    """Every cut of a token into two tokens of the vocabulary, ranked by the merged token's place in the file
    (SentencePiece lists its pieces best first; Gemma's scores do not follow that order), and the cuts of one token
    longest left piece first, as Hugging Face's SentencePiece conversion ranks them."""
    vocabulary = set(tokens)
    return [
        (token[:cut], token[cut:])
        for token in tokens
        for cut in range(len(token) - 1, 0, -1)
        if token[:cut] in vocabulary and token[cut:] in vocabulary
    ]


def sentencepiece_model(tokens: list[str], unknown: str | None) -> Tokenizer:
    """The BPE model with Gemma's normaliser, pre-tokenizer and decoder over `tokens` (file order is id order)."""
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=recovered_merges(tokens),
        unk_token=unknown,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    # Gemma's tokenizer.json splits at spaces after the normaliser has replaced them all, so a text reaches the
    # model whole: kept so that the rebuilt tokenizer.json reads as Gemma's does.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


def end_of_turn_id(tokens: list[str], token_types: list[int]) -> int | None:
    """The id of Gemma's end-of-turn control token, where the vocabulary has one."""
    for index, (token, token_type) in enumerate(zip(tokens, token_types, strict=True)):
        if token == END_OF_TURN and token_type == TOKEN_TYPE_CONTROL:
            return index
    return None
