"""One model's tokenizer: explicit truncation, no implicit padding, batched encoding, numpy padding.

The MiniLM tokenizer.json files carry a fixed pad-to-128; every tokenizer loaded here has that
cleared, so a batch pads only to its own longest item (seed 001 "Preparation And Framing"). Token ids
leave the tokenizer as int64 arrays, one per text, and stay arrays until a graph is fed: no Python
list is rebuilt per token on the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import blake3
import numpy as np
import tokenizers

TOKENIZER_ID_HEX_CHARS = 32


class TokenizerError(Exception):
    """The tokenizer file is missing or unreadable; the message names the file."""


def tokenizer_id_for(tokenizer_json: bytes) -> str:
    """BLAKE3 of the tokenizer.json bytes, first 32 hex characters (the IPC `tokenizer_id`)."""
    return blake3.blake3(tokenizer_json).hexdigest()[:TOKENIZER_ID_HEX_CHARS]


def _arrays_equal(left: np.ndarray, right: np.ndarray) -> bool:
    return bool(np.array_equal(left, right))


def _ids() -> Any:
    return attrs.field(eq=attrs.cmp_using(eq=_arrays_equal))


@attrs.frozen
class TokenizedText:
    """One encoded input, unpadded: int64 id arrays, a 0/1 special-token mask and character offsets.
    `truncated` says the text was longer than `max_length` tokens."""

    input_ids: np.ndarray = _ids()
    token_type_ids: np.ndarray = _ids()
    special_tokens_mask: np.ndarray = _ids()
    offsets: list[tuple[int, int]]
    truncated: bool

    def __len__(self) -> int:
        return len(self.input_ids)


@attrs.frozen
class PaddedBatch:
    """int64 arrays `[batch, longest]`, ready to feed an ONNX BERT graph."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray


class TextTokenizer:
    """A tokenizer configured for one model; thread-safe for encoding (`tokenizers` releases the GIL)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, tokenizer_id: str, max_length: int, pad_id: int) -> None:
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.tokenizer_id = tokenizer_id
        self.max_length = max_length
        self.pad_id = pad_id
        decoder = tokenizer.get_added_tokens_decoder()
        # Ids of the special tokens ([CLS], [SEP], [PAD], ...), excluded from token-level outputs.
        self.special_ids = frozenset(token_id for token_id, token in decoder.items() if token.special)
        self.special_id_array = np.fromiter(sorted(self.special_ids), dtype=np.int64)

    @classmethod
    def from_file(cls, path: Path, max_length: int) -> TextTokenizer:
        """Load `tokenizer.json`; the pad id is the file's `[PAD]` (or `<pad>`) token, else 0."""
        try:
            data = Path(path).read_bytes()
            tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception on bad files
            raise TokenizerError(f"cannot load tokenizer {path}: {exc}") from exc
        pad_id = next((tid for token in ("[PAD]", "<pad>") if (tid := tokenizer.token_to_id(token)) is not None), 0)
        return cls(tokenizer, tokenizer_id_for(data), max_length, pad_id)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def encode_batch(self, texts: Sequence[str | tuple[str, str]]) -> list[TokenizedText]:
        """Encode texts (or `(query, document)` pairs) in one call, truncated to `max_length`."""
        encodings = self._tokenizer.encode_batch(list(texts))
        return [
            TokenizedText(
                input_ids=np.array(encoding.ids, dtype=np.int64),
                token_type_ids=np.array(encoding.type_ids, dtype=np.int64),
                special_tokens_mask=np.array(encoding.special_tokens_mask, dtype=np.int8),
                offsets=encoding.offsets,
                truncated=bool(encoding.overflowing),
            )
            for encoding in encodings
        ]

    def prepared(self, input_ids: np.ndarray, token_type_ids: np.ndarray | None = None) -> TokenizedText:
        """A TokenizedText for ids this tokenizer made elsewhere (the sidecar's prepared tokens); no offsets."""
        type_ids = token_type_ids if token_type_ids is not None else np.zeros_like(input_ids)
        special = np.isin(input_ids, self.special_id_array).astype(np.int8)
        return TokenizedText(input_ids, type_ids, special, [], False)


def pad_batch(
    items: Sequence[np.ndarray | Sequence[int]], type_ids: Sequence[np.ndarray | Sequence[int]] | None, pad_id: int
) -> PaddedBatch:
    """Right-pad ragged id rows (arrays or lists) to the longest one; the mask marks real tokens."""
    longest = max((len(ids) for ids in items), default=0)
    input_ids = np.full((len(items), longest), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(items), longest), dtype=np.int64)
    token_type_ids = np.zeros((len(items), longest), dtype=np.int64)
    for row, ids in enumerate(items):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
        if type_ids is not None:
            token_type_ids[row, : len(ids)] = type_ids[row]
    return PaddedBatch(input_ids, attention_mask, token_type_ids)


def prepare_text(
    text: str,
    *,
    is_query: bool = False,
    instruction: str | None = None,
    query_template: str | None = None,
    doc_template: str | None = None,
) -> str:
    """The exact text a model sees: the query/doc template (with `{text}`), then the instruction prefix.

    The sidecar and the worker both call this, so prepared tokens match a worker-side re-tokenization.
    """
    template = query_template if is_query else doc_template
    if template:
        text = template.replace("{text}", text)
    if instruction:
        text = f"{instruction} {text}"
    return text
