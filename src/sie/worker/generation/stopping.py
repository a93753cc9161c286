"""Which generated text may be released and when a sequence ends: the StopChecker applies a sequence's stop strings,
stop tokens and max_tokens (its SamplingParams) token by token, and holds back text that may still become a stop
string or an incomplete UTF-8 character. Pure: it sees token ids and a TokenDecoder, never logits or I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import attrs

from sie.wire.generate import FINISH_LENGTH, FINISH_STOP
from sie.worker.generation.sampling import SamplingParams

# What a byte-level BPE decode yields for bytes that do not (yet) form a whole UTF-8 character.
REPLACEMENT_CHARACTER: Final = "\ufffd"

TokenDecoder = Callable[[Sequence[int]], str]


@attrs.frozen
class StopStep:
    """What one generated token releases: new text for the caller, and why generation ended (None: go on)."""

    text: str
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class StopChecker:
    """Decides, token by token, which generated text is final and when generation ends.

    Text is released only once it can no longer turn out to belong to a stop string (the longest suffix that
    starts one is held back) or to an incomplete UTF-8 character (a trailing U+FFFD is held back). A stop token
    or stop string ends with "stop" and neither is released; the max_tokens-th token ends with "length" and
    releases everything held. `decode` maps the generated ids (never the prompt) to their text.
    """

    def __init__(self, params: SamplingParams, decode: TokenDecoder) -> None:
        self._params = params
        self._decode = decode
        self._token_ids: list[int] = []
        self._steps = 0
        self._released = 0  # characters of the decoded text already handed out
        self._finished = False

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The generated ids whose text counts (a stop token excluded)."""
        return tuple(self._token_ids)

    @property
    def steps(self) -> int:
        """Tokens fed so far, a stop token included (what max_tokens counts)."""
        return self._steps

    def push(self, token_id: int) -> StopStep:
        """Feed the next generated token; the answer says what text is released and whether generation ended."""
        if self._finished:
            raise RuntimeError("StopChecker.push after generation finished; this is a bug")
        self._steps += 1
        if token_id in self._params.stop_token_ids:
            return self._finish(self._decode(self._token_ids), FINISH_STOP)
        self._token_ids.append(int(token_id))
        text = self._decode(self._token_ids)
        stop_at = self._first_stop_string(text)
        if stop_at is not None:
            return self._finish(text[:stop_at], FINISH_STOP)
        if self._steps >= self._params.max_tokens:
            return self._finish(text, FINISH_LENGTH)
        return self._release(text[: self._safe_end(text)])

    def _first_stop_string(self, text: str) -> int | None:
        # A stop string cannot start inside released text: its start would have been held back.
        starts = [text.find(stop, self._released) for stop in self._params.stop]
        found = [start for start in starts if start >= 0]
        return min(found) if found else None

    def _safe_end(self, text: str) -> int:
        complete = len(text.rstrip(REPLACEMENT_CHARACTER))
        held = _longest_stop_prefix(text[:complete], self._params.stop)
        return max(complete - held, self._released)

    def _release(self, upto: str) -> StopStep:
        released = upto[self._released :]
        self._released = max(len(upto), self._released)
        return StopStep(released)

    def _finish(self, final_text: str, reason: str) -> StopStep:
        self._finished = True
        return StopStep(self._release(final_text).text, reason)


def _longest_stop_prefix(text: str, stops: Sequence[str]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `stops`."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest
