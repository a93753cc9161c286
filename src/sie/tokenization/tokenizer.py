"""One model's tokenizer: explicit truncation, no implicit padding, batched encoding, numpy padding.

The MiniLM tokenizer.json files carry a fixed pad-to-128; every tokenizer loaded here has that
cleared, so a batch pads only to its own longest item (seed 001 "Preparation And Framing"). Token ids
leave the tokenizer as int64 arrays, one per text, and stay arrays until a graph is fed: no Python
list is rebuilt per token on the way.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import blake3
import numpy as np
import tokenizers

TOKENIZER_ID_HEX_CHARS = 32
# A token covers at least one character; past this many characters per token of `max_length` a text has
# more tokens than the model reads unless it is mostly whitespace (which the model would not read either).
MAX_CHARS_PER_TOKEN: Final = 64


class TokenizerError(Exception):
    """The tokenizer file is missing or unreadable; the message names the file."""


def tokenizer_id_for(tokenizer_json: bytes) -> str:
    """BLAKE3 of the tokenizer.json bytes, first 32 hex characters (the IPC `tokenizer_id`)."""
    return blake3.blake3(tokenizer_json).hexdigest()[:TOKENIZER_ID_HEX_CHARS]


class TokenizedText:
    """One encoded input, unpadded: int64 id arrays; `truncated` says the text was longer than `max_length`
    tokens. The special-token mask and the character offsets are derived only for the adapters that read
    them (token-level outputs), from the tokenizer's table and its own encoding."""

    __slots__ = ("_encoding", "_special_table", "input_ids", "token_type_ids", "truncated")

    def __init__(
        self,
        input_ids: np.ndarray,
        token_type_ids: np.ndarray,
        special_table: np.ndarray,
        truncated: bool = False,
        encoding: tokenizers.Encoding | None = None,
    ) -> None:
        self.input_ids = input_ids
        self.token_type_ids = token_type_ids
        self.truncated = truncated
        self._special_table = special_table
        self._encoding = encoding

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def special_tokens_mask(self) -> np.ndarray:
        """1 where the token is a special one ([CLS], [SEP], ...): as the tokenizer marked it, or by id for
        ids made elsewhere."""
        if self._encoding is not None:
            return np.array(self._encoding.special_tokens_mask, dtype=np.int8)
        # `clip`: an id past the vocabulary (from a broken peer) fails in the graph, not here.
        return np.take(self._special_table, self.input_ids, mode="clip")

    @property
    def offsets(self) -> list[tuple[int, int]]:
        """Character offsets of each token in its text; `[]` for ids made elsewhere (no text at hand)."""
        return self._encoding.offsets if self._encoding is not None else []


@attrs.frozen
class TokenizedWords:
    """One text given as words, encoded: int64 ids and, for each token, the index of the word it belongs to (-1 for
    the special tokens); `truncated` says tokens past `max_length` were cut."""

    input_ids: np.ndarray
    word_ids: np.ndarray
    truncated: bool = False

    def __len__(self) -> int:
        return len(self.input_ids)

    def first_tokens(self) -> dict[int, int]:
        """The position of each word's first token, by word index (a word that makes no token is absent)."""
        first: dict[int, int] = {}
        for position, word in enumerate(self.word_ids.tolist()):
            if word >= 0 and word not in first:
                first[word] = position
        return first


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
        self._whole: tokenizers.Tokenizer | None = None
        self._copy_lock = threading.Lock()
        self.tokenizer_id = tokenizer_id
        self.max_length = max_length
        self.pad_id = pad_id
        decoder = tokenizer.get_added_tokens_decoder()
        # Ids of the special tokens ([CLS], [SEP], [PAD], ...), excluded from token-level outputs.
        self.special_ids = frozenset(token_id for token_id, token in decoder.items() if token.special)
        self.special_id_array = np.fromiter(sorted(self.special_ids), dtype=np.int64)
        # 1 at every special id: a text's special-token mask is one lookup, with no Python per token.
        size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(self.special_ids, default=0) + 1)
        self._special_table = np.zeros(size, dtype=np.int8)
        self._special_table[self.special_id_array] = 1

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

    def with_added_tokens(self, special: Sequence[str], plain: Sequence[str]) -> TextTokenizer:
        """A copy with `special` then `plain` tokens added where the vocabulary lacks them, numbered after its last
        entry as transformers' `add_special_tokens` and `add_tokens` number them (a model that adds its markers
        when it loads, and saves no tokenizer of its own: GLiREL); this one itself unchanged."""
        copy = tokenizers.Tokenizer.from_str(self._tokenizer.to_str())
        missing_special = [token for token in special if copy.token_to_id(token) is None]
        if missing_special:
            copy.add_special_tokens(missing_special)
        missing_plain = list(dict.fromkeys(token for token in plain if copy.token_to_id(token) is None))
        if missing_plain:
            copy.add_tokens(missing_plain)
        data = copy.to_str().encode("utf-8")
        return TextTokenizer(copy, tokenizer_id_for(data), self.max_length, self.pad_id)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (added tokens included), None when `token` is not one."""
        return self._tokenizer.token_to_id(token)

    def cut(self, tokenized: TokenizedText, limit: int) -> TokenizedText:
        """`tokenized` kept to `limit` tokens as truncation at `limit` would have made it: the first tokens, and the
        closing special token ([SEP], </s>) when the text ends with one. Unchanged when it fits."""
        if len(tokenized) <= limit:
            return tokenized
        ids, type_ids = tokenized.input_ids, tokenized.token_type_ids
        if limit > 1 and tokenized.special_tokens_mask[-1]:
            ids = np.concatenate([ids[: limit - 1], ids[-1:]])
            type_ids = np.concatenate([type_ids[: limit - 1], type_ids[-1:]])
        else:
            ids, type_ids = ids[:limit], type_ids[:limit]
        return TokenizedText(ids, type_ids, self._special_table, truncated=True)

    def encode_batch(self, texts: Sequence[str | tuple[str, str]]) -> list[TokenizedText]:
        """Encode texts (or `(query, document)` pairs) in one call, truncated to `max_length`.

        A text longer than `max_length × MAX_CHARS_PER_TOKEN` characters is cut to that first: the tokenizer
        would read all of it only to keep the first `max_length` tokens (a 100,000-character text costs
        milliseconds and megabytes for nothing). Offsets stay those of the original text (a prefix of it).
        """
        limit = self.max_length * MAX_CHARS_PER_TOKEN
        cut = [_longer_than(text, limit) for text in texts]
        inputs = [_prefix(text, limit) for text in texts] if any(cut) else list(texts)
        encodings = self._tokenizer.encode_batch(inputs)
        return [self._tokenized(encoding, was_cut) for encoding, was_cut in zip(encodings, cut, strict=True)]

    def encode_words(self, rows: Sequence[Sequence[str]]) -> list[TokenizedWords]:
        """Encode texts already split into words, each word read on its own (transformers' `is_split_into_words`),
        with the special tokens, truncated to `max_length`."""
        encodings = self._tokenizer.encode_batch([list(words) for words in rows], is_pretokenized=True)
        return [
            TokenizedWords(
                np.array(encoding.ids, dtype=np.int64),
                np.array([-1 if word is None else word for word in encoding.word_ids], dtype=np.int64),
                bool(encoding.overflowing),
            )
            for encoding in encodings
        ]

    def word_token_counts(self, texts: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """For each text given as words, how many tokens each word makes on its own (no special tokens, no
        truncation): what a window of a long text's words will take. One tokenizer call for all of them."""
        rows = [list(words) for words in texts]
        counts = [np.zeros(len(words), dtype=np.int64) for words in rows]
        filled = [index for index, words in enumerate(rows) if words]
        if filled:
            encodings = self._untruncated().encode_batch(
                [rows[index] for index in filled], is_pretokenized=True, add_special_tokens=False
            )
            for index, encoding in zip(filled, encodings, strict=True):
                word_ids = np.array([word for word in encoding.word_ids if word is not None], dtype=np.int64)
                counts[index] = np.bincount(word_ids, minlength=len(rows[index])).astype(np.int64)
        return counts

    def pieces(self, strings: Sequence[str]) -> dict[str, np.ndarray]:
        """The ids each distinct string makes on its own, without special tokens or truncation (transformers'
        `tokenize` of one word or marker, then `convert_tokens_to_ids`): for models that assemble a row from words
        tokenized one by one (GLiNER2). One tokenizer call for all of them."""
        distinct = list(dict.fromkeys(strings))
        if not distinct:
            return {}
        encodings = self._untruncated().encode_batch(distinct, add_special_tokens=False)
        return {
            text: np.array(encoding.ids, dtype=np.int64) for text, encoding in zip(distinct, encodings, strict=True)
        }

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` makes with the special tokens, untruncated (at most `max_length` ×
        MAX_CHARS_PER_TOKEN characters are read: past that the count is only known to exceed `max_length`)."""
        limit = self.max_length * MAX_CHARS_PER_TOKEN
        return len(self._untruncated().encode(text[:limit]).ids)

    def _untruncated(self) -> tokenizers.Tokenizer:
        """A copy of the tokenizer that reads whole texts, made on first use (only word-windowing models need it)."""
        with self._copy_lock:
            if self._whole is None:
                whole = tokenizers.Tokenizer.from_str(self._tokenizer.to_str())
                whole.no_truncation()
                whole.no_padding()
                self._whole = whole
            return self._whole

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[dict[str, Any]]:
        """The tokens of `text` as the model reads them (cut at `max_length`): `id`, `text` (a special token's own
        string, else the characters of `text` it covers), `special`, and `start`/`stop` character offsets in `text`
        (None for a special token)."""
        limit = self.max_length * MAX_CHARS_PER_TOKEN
        encoding = self._tokenizer.encode(text[:limit], add_special_tokens=add_special_tokens)
        tokens = []
        for token_id, token, special, (start, stop) in zip(
            encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets, strict=True
        ):
            if special:
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": start,
                               "stop": stop})  # fmt: skip
        return tokens

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of token `ids`; ValueError names the first id that is not in the vocabulary."""
        size = self.vocab_size
        bad = next((token_id for token_id in ids if not 0 <= token_id < size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is not in this model's vocabulary of {size}")
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def prepared(
        self, input_ids: np.ndarray, token_type_ids: np.ndarray | None = None, truncated: bool = False
    ) -> TokenizedText:
        """A TokenizedText for ids this tokenizer made elsewhere (the sidecar's prepared tokens)."""
        type_ids = token_type_ids if token_type_ids is not None else np.zeros_like(input_ids)
        return TokenizedText(input_ids, type_ids, self._special_table, truncated)

    def _tokenized(self, encoding: tokenizers.Encoding, was_cut: bool = False) -> TokenizedText:
        ids = np.array(encoding.ids, dtype=np.int64)
        type_ids = np.array(encoding.type_ids, dtype=np.int64)
        truncated = was_cut or bool(encoding.overflowing)
        return TokenizedText(ids, type_ids, self._special_table, truncated, encoding)


def _longer_than(text: str | tuple[str, str], limit: int) -> bool:
    parts = text if isinstance(text, tuple) else (text,)
    return any(len(part) > limit for part in parts)


def _prefix(text: str | tuple[str, str], limit: int) -> str | tuple[str, str]:
    if isinstance(text, tuple):
        return (text[0][:limit], text[1][:limit])
    return text[:limit]


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


# A batch is cut into runs of similar length only where that saves at least this share of its padded tokens
# (and MIN_SAVED_TOKENS): each run has a fixed cost, and small runs use the hardware less well.
MIN_SAVED_SHARE: Final = 0.125
MIN_SAVED_TOKENS: Final = 32


def length_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of rows of these token lengths, split into runs that pad little: longest first, a run is cut
    before a row when every row from there on is so much shorter that padding them to the run's longest would
    waste at least MIN_SAVED_SHARE of the whole batch's padded tokens. One group (all rows, in order) when no cut
    pays. A batch of sentences of 12 to 18 tokens, a few of them long, computes a fifth fewer tokens this way.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    if not order:
        return []
    if lengths[order[0]] == lengths[order[-1]]:
        return [list(range(len(lengths)))]
    needed = max(MIN_SAVED_TOKENS, MIN_SAVED_SHARE * len(order) * lengths[order[0]])
    groups: list[list[int]] = [[order[0]]]
    longest = lengths[order[0]]
    for position in range(1, len(order)):
        row = order[position]
        remaining = len(order) - position
        if remaining * (longest - lengths[row]) >= needed:
            groups.append([])
            longest = lengths[row]
        groups[-1].append(row)
    return groups


TEXT_PLACEHOLDER: Final = "{text}"
INSTRUCTION_PLACEHOLDER: Final = "{instruction}"


def prepare_text(  # noqa: PLR0913 - the parts of one text's preparation
    text: str,
    *,
    is_query: bool = False,
    instruction: str | None = None,
    query_template: str | None = None,
    doc_template: str | None = None,
    default_instruction: str | None = None,
) -> str:
    """The exact text a model sees: the query/doc template (with `{text}`), then the instruction prefix. A template
    that places the instruction itself (`Instruct: {instruction}\nQuery: {text}`, as stella's) gets the instruction,
    else `default_instruction`, there and no prefix.

    The sidecar and the worker both call this, so prepared tokens match a worker-side re-tokenization.
    """
    template = query_template if is_query else doc_template
    if template and INSTRUCTION_PLACEHOLDER in template:
        filled = instruction or default_instruction or ""
        return text.join(part.replace(INSTRUCTION_PLACEHOLDER, filled) for part in template.split(TEXT_PLACEHOLDER))
    if template:
        text = template.replace(TEXT_PLACEHOLDER, text)
    if instruction:
        text = f"{instruction} {text}"
    return text


def with_end_token(tokenizer_json: str, token: str) -> str:
    """`tokenizer_json` (a tokenizer.json's text) rewritten to end every text with `token`, a vocabulary entry (a
    decoder embedder's end of sequence, which its last-token pooling reads): appended to the post-processor's
    template, or a template of its own where the file has no post-processor. Truncation keeps it, as it keeps every
    template token. TokenizerError for a token the vocabulary lacks or a post-processor that is not a template."""
    try:
        data = json.loads(tokenizer_json)
        token_id = tokenizers.Tokenizer.from_str(tokenizer_json).token_to_id(token)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception on bad files
        raise TokenizerError(f"cannot read the tokenizer: {exc}") from exc
    if token_id is None:
        raise TokenizerError(f"the end token {token!r} is not in the tokenizer's vocabulary")
    special = {"SpecialToken": {"id": token, "type_id": 0}}
    post = data.get("post_processor")
    if post is None:
        post = {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {}}  # fmt: skip
    if post.get("type") != "TemplateProcessing":
        raise TokenizerError(f"cannot append {token!r}: the post-processor is a {post.get('type')}, not a template")
    if post["single"][-1] != special:
        post["single"] = [*post["single"], special]
        post["pair"] = [*post["pair"], {"SpecialToken": {"id": token, "type_id": 1}}]
    post["special_tokens"] = {**post["special_tokens"], token: {"id": token, "ids": [token_id], "tokens": [token]}}
    data["post_processor"] = post
    return json.dumps(data, ensure_ascii=False)
