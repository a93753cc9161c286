"""A thinking model's reasoning kept out of its answer: Qwen3 (and its kin) write `<think>…</think>` before the answer
when their chat template lets them think, Gemma 4 a thought channel, `<|channel>thought\\n…<channel|>` (it may open one
even with thinking off). The public SIE server never returns that block; `answer_text` is the generated text without
it, computed over the whole text decoded so far, so each longer text gives an answer that extends the previous one
(what the stop checker releases stays released): nothing is released while the text may still be opening a block or
is inside one, and a generation that ends inside its reasoning answers nothing.

Gemma 4's channel markers are special tokens, which decoding leaves out: `ReasoningMarkers.of` finds a vocabulary's
markers, and `decoded_with_markers` decodes generated ids with those two kept, so `answer_text` can see them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs
import tokenizers


@attrs.frozen
class ReasoningMarkers:
    """The text that opens and closes a reasoning block, and their token ids where they are special tokens."""

    open: str
    close: str
    special_ids: tuple[int, int] | None = None  # (open, close), kept when decoding

    @classmethod
    def of(cls, tokenizer: tokenizers.Tokenizer) -> ReasoningMarkers:
        """Gemma 4's thought channel where the vocabulary has its two markers, else `<think>…</think>`."""
        open_id, close_id = tokenizer.token_to_id(CHANNEL.open), tokenizer.token_to_id(CHANNEL.close)
        if open_id is not None and close_id is not None:
            return attrs.evolve(CHANNEL, special_ids=(open_id, close_id))
        return THINK


THINK: Final = ReasoningMarkers("<think>", "</think>")
CHANNEL: Final = ReasoningMarkers("<|channel>", "<channel|>")


def answer_text(text: str, markers: ReasoningMarkers = THINK) -> str:
    """`text` (everything generated so far) less a leading reasoning block and the whitespace around it."""
    stripped = text.lstrip()
    if markers.open.startswith(stripped):  # nothing yet, or what may still become the opening marker
        return ""
    if not stripped.startswith(markers.open):
        return text
    end = stripped.find(markers.close)
    return "" if end < 0 else stripped[end + len(markers.close) :].lstrip()


def decoded_with_markers(tokenizer: tokenizers.Tokenizer, token_ids: Sequence[int], markers: ReasoningMarkers) -> str:
    """The text of `token_ids`, special tokens left out but the markers' own (each run between them decoded apart)."""
    if markers.special_ids is None:
        return tokenizer.decode(list(token_ids), skip_special_tokens=True)
    shown = dict(zip(markers.special_ids, (markers.open, markers.close), strict=True))
    parts, run = [], []
    for token in token_ids:
        if token in shown:
            parts.extend([tokenizer.decode(run, skip_special_tokens=True), shown[token]])
            run = []
        else:
            run.append(token)
    parts.append(tokenizer.decode(run, skip_special_tokens=True))
    return "".join(parts)
