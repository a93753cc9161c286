"""How the next token of a sequence is chosen: SamplingParams (how one sequence is decoded and when it ends, each
value checked) and the Sampler (greedy, or a seeded draw after temperature, top-k and top-p; OpenAI's presence and
frequency penalties on the tokens generated so far first). Pure numpy over one sequence's logits: no onnxruntime, no
I/O; `stopping` applies the params' stop rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs
import numpy as np

# a request's four stop strings (OpenAI's limit, which the gateway applies) and up to four of its model profile's own
MAX_REQUEST_STOP_STRINGS: Final = 4
MAX_STOP_STRINGS: Final = 2 * MAX_REQUEST_STOP_STRINGS
MAX_PENALTY: Final = 2.0  # OpenAI's range for presence_penalty and frequency_penalty: [-2, 2]


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


def _check_penalty(_instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not (np.isfinite(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
        raise ValueError(f"{attribute.name} must be a number from {-MAX_PENALTY:g} to {MAX_PENALTY:g}, got {value!r}")


def _check_min_tokens(_instance: object, _attribute: object, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"min_tokens must be an integer >= 0, got {value!r}")


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
    # subtracted from a generated token's logit once it has appeared (presence), and per appearance (frequency)
    presence_penalty: float = attrs.field(default=0.0, validator=_check_penalty)
    frequency_penalty: float = attrs.field(default=0.0, validator=_check_penalty)
    # no stop token (`stop_token_ids`) is chosen before this many tokens were generated
    min_tokens: int = attrs.field(default=0, validator=_check_min_tokens)


class Sampler:
    """Picks each next token of one sequence; its own random generator makes a seeded sequence reproducible. It
    counts the tokens it picked, which the penalties read (the prompt's tokens are not penalised, as in OpenAI's
    definition)."""

    def __init__(self, params: SamplingParams) -> None:
        self._params = params
        self._rng = np.random.default_rng(params.seed)
        self._penalised = params.presence_penalty != 0 or params.frequency_penalty != 0
        self._counts: dict[int, int] = {}
        self._generated = 0
        self._stop_ids = np.fromiter(sorted(params.stop_token_ids), dtype=np.int64)

    def next_token(self, logits: np.ndarray) -> int:
        """The next token id from the last position's logits (shape `[vocab]`)."""
        logits = self.penalised(_vector(logits))
        if self._generated < self._params.min_tokens:
            logits = self.without_stops(logits)
        self._generated += 1
        if self._params.temperature == 0:
            token = int(np.argmax(logits))
        else:
            probabilities = self.probabilities(logits)
            candidates = np.flatnonzero(probabilities)
            weights = probabilities[candidates]
            token = int(candidates[self._rng.choice(len(candidates), p=weights / weights.sum())])
        if self._penalised:
            self._counts[token] = self._counts.get(token, 0) + 1
        return token

    def without_stops(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with the stop tokens' (those within the vocabulary) at -inf: a copy."""
        blocked = self._stop_ids[self._stop_ids < logits.size]
        kept = logits.astype(np.float64 if logits.dtype == np.float64 else np.float32, copy=True)
        kept[blocked] = -np.inf
        return kept

    def penalised(self, logits: np.ndarray) -> np.ndarray:
        """`logits` less, for each token picked so far, presence_penalty + frequency_penalty × its count (a copy;
        `logits` itself when no penalty is set or nothing was picked yet)."""
        if not self._counts:
            return logits
        tokens = np.fromiter(self._counts, dtype=np.int64, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.float64, count=len(self._counts))
        penalties = self._params.presence_penalty + self._params.frequency_penalty * counts
        adjusted = logits.astype(np.float64 if logits.dtype == np.float64 else np.float32, copy=True)
        adjusted[tokens] -= penalties.astype(adjusted.dtype)
        return adjusted

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
