"""A thinking model's reasoning kept out of its answer: Qwen3 (and its kin) write `<think>…</think>` before the answer
when their chat template lets them think. The public SIE server never returns that block; `answer_text` is the
generated text without it, computed over the whole text decoded so far, so each longer text gives an answer that
extends the previous one (what the stop checker releases stays released): nothing is released while the text may
still be opening a block or is inside one, and a generation that ends inside its reasoning answers nothing.
"""

from __future__ import annotations

from typing import Final

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"


def answer_text(text: str) -> str:
    """`text` (everything generated so far) less a leading reasoning block and the whitespace around it."""
    stripped = text.lstrip()
    if THINK_OPEN.startswith(stripped):  # nothing yet, or what may still become the opening tag
        return ""
    if not stripped.startswith(THINK_OPEN):
        return text
    end = stripped.find(THINK_CLOSE)
    return "" if end < 0 else stripped[end + len(THINK_CLOSE) :].lstrip()
