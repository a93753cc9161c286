"""The decoding policy a causal-LM adapter applies after each decode step: which token comes next (greedy, or a
seeded draw after temperature, top-k and top-p) and which generated text may be released now (stop strings, stop
tokens, max_tokens, incomplete UTF-8). Pure numpy over one sequence's logits and token ids: no onnxruntime, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

import attrs
import numpy as np

FINISH_STOP: Final = "stop"
FINISH_LENGTH: Final = "length"
MAX_STOP_STRINGS: Final = 4
# What a byte-level BPE decode yields for bytes that do not (yet) form a whole UTF-8 character.
REPLACEMENT_CHARACTER: Final = "\ufffd"

TokenDecoder = Callable[[Sequence[int]], str]


def _stop_strings(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):  # one stop string, as OpenAI's `stop` also accepts
        return (value,)
    return tuple(value)


def _check_temperature(_instance: object, _attribute: object, value: float) -> None:
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {value!r}")


def _check_top_p(_instance: object, _attribute: object, value: float) -> None:
    if not (0 < value <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {value!r}")


def _check_top_k(_instance: object, _attribute: object, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 is off), got {value!r}")


def _check_seed(_instance: object, _attribute: object, value: int | None) -> None:
    if value is not None and not _is_int(value):
        raise ValueError(f"seed must be an integer or None, got {value!r}")


def _check_max_tokens(_instance: object, _attribute: object, value: int) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {value!r}")


def _check_stop(_instance: object, _attribute: object, value: tuple[str, ...]) -> None:
    if len(value) > MAX_STOP_STRINGS:
        raise ValueError(f"stop holds at most {MAX_STOP_STRINGS} strings, got {len(value)}")
    if any(not isinstance(stop, str) or not stop for stop in value):
        raise ValueError(f"stop strings must be non-empty strings, got {list(value)!r}")


def _check_stop_token_ids(_instance: object, _attribute: object, value: frozenset[int]) -> None:
    if any(not _is_int(token) or token < 0 for token in value):
        raise ValueError(f"stop_token_ids must be integers >= 0, got {sorted(value, key=repr)!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@attrs.frozen
class SamplingParams:
    """How one sequence is decoded and when it ends; a bad value raises ValueError naming its field."""

    temperature: float = attrs.field(default=1.0, validator=_check_temperature)
    top_p: float = attrs.field(default=1.0, validator=_check_top_p)
    top_k: int = attrs.field(default=0, validator=_check_top_k)
    seed: int | None = attrs.field(default=None, validator=_check_seed)
    max_tokens: int = attrs.field(default=16, validator=_check_max_tokens)
    stop: tuple[str, ...] = attrs.field(default=(), converter=_stop_strings, validator=_check_stop)
    stop_token_ids: frozenset[int] = attrs.field(
        default=frozenset(), converter=frozenset, validator=_check_stop_token_ids
    )


class Sampler:
    """Picks each next token of one sequence; its own random generator makes a seeded sequence reproducible."""

    def __init__(self, params: SamplingParams) -> None:
        self._params = params
        self._rng = np.random.default_rng(params.seed)

    def next_token(self, logits: np.ndarray) -> int:
        """The next token id from the last position's logits (shape `[vocab]`)."""
        logits = _vector(logits)
        if self._params.temperature == 0:
            return int(np.argmax(logits))
        probabilities = self.probabilities(logits)
        candidates = np.flatnonzero(probabilities)
        weights = probabilities[candidates]
        return int(candidates[self._rng.choice(len(candidates), p=weights / weights.sum())])

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution a token is drawn from: softmax of `logits / temperature`, zero outside the top-k and
        outside the nucleus (the fewest most likely tokens whose probability adds up to top_p), renormalised."""
        logits = _vector(logits)
        if self._params.temperature == 0:  # greedy: all the mass on the argmax
            one_hot = np.zeros(logits.shape, dtype=np.float64)
            one_hot[np.argmax(logits)] = 1.0
            return one_hot
        scaled = logits.astype(np.float64) / self._params.temperature
        top_k = self._params.top_k
        if 0 < top_k < scaled.size:
            outside = np.argpartition(scaled, -top_k)[:-top_k]
            scaled[outside] = -np.inf
        probabilities = _softmax(scaled)
        if self._params.top_p < 1:
            probabilities = _nucleus(probabilities, self._params.top_p)
        return probabilities


def _vector(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be one non-empty [vocab] vector, got shape {logits.shape}")
    return logits


def _softmax(scaled: np.ndarray) -> np.ndarray:
    highest = np.max(scaled)
    if not np.isfinite(highest):
        raise ValueError(f"logits have no finite maximum ({highest}); cannot sample")
    exponentials = np.exp(scaled - highest)  # shifted so the largest is exp(0): no overflow
    return exponentials / exponentials.sum()


def _nucleus(probabilities: np.ndarray, top_p: float) -> np.ndarray:
    order = np.argsort(probabilities, kind="stable")[::-1]
    cumulative = np.cumsum(probabilities[order])
    # The first position where the running total reaches top_p is the last token kept.
    kept = min(int(np.searchsorted(cumulative, top_p, side="left")) + 1, order.size)
    nucleus = np.zeros_like(probabilities)
    nucleus[order[:kept]] = probabilities[order[:kept]]
    return nucleus / nucleus.sum()


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
