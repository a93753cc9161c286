"""Text tokenization shared by the sidecar (preparation) and the worker (re-tokenization, offsets).

Wraps `tokenizers` with truncation and padding always set explicitly, batch encoding in one call,
padding to the batch's longest item (rows of very different lengths split into runs first), and a stable
`tokenizer_id`. It imports no other sie package.
"""

from sie.tokenization.tokenizer import (
    INSTRUCTION_PLACEHOLDER,
    TEXT_PLACEHOLDER,
    PaddedBatch,
    TextTokenizer,
    TokenizedText,
    TokenizedWords,
    TokenizerError,
    length_groups,
    pad_batch,
    prepare_text,
    tokenizer_id_for,
    with_end_token,
)

__all__ = [
    "INSTRUCTION_PLACEHOLDER",
    "TEXT_PLACEHOLDER",
    "PaddedBatch",
    "TextTokenizer",
    "TokenizedText",
    "TokenizedWords",
    "TokenizerError",
    "length_groups",
    "pad_batch",
    "prepare_text",
    "tokenizer_id_for",
    "with_end_token",
]
