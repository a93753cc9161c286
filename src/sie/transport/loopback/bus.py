"""The loopback's core pub/sub: subject patterns (NATS wildcards: `*` one token, `>` one or more trailing
tokens; the pool streams route by them too) and the subscriptions a publish reaches in-process, by reference.

Owns the subscription list and nothing else; a raising handler is logged and never reaches the publisher or
the other subscribers (NATS delivers to each subscriber independently).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

SINGLE_WILDCARD = "*"
FULL_WILDCARD = ">"


class SubjectPattern:
    """One compiled subscription or stream subject; `matches` takes a subject already split on dots."""

    __slots__ = ("text", "literal", "_head", "_open_tail", "_length")

    def __init__(self, pattern: str) -> None:
        tokens = pattern.split(".")
        if not pattern or "" in tokens:
            raise ValueError(f"invalid subject pattern {pattern!r}: empty token")
        if FULL_WILDCARD in tokens[:-1]:
            raise ValueError(f"invalid subject pattern {pattern!r}: '>' must be the last token")
        self.text = pattern
        self._open_tail = tokens[-1] == FULL_WILDCARD
        self._head = tuple(tokens[:-1] if self._open_tail else tokens)
        self._length = len(tokens)
        has_wildcard = self._open_tail or SINGLE_WILDCARD in tokens
        # A pattern without wildcards is compared as one string, the common case for exact subjects.
        self.literal: str | None = None if has_wildcard else pattern

    def matches(self, subject: str, tokens: list[str]) -> bool:
        """Whether `subject` (split into `tokens`) is one this pattern captures."""
        if self.literal is not None:
            return subject == self.literal
        if self._open_tail:
            if len(tokens) < self._length:
                return False
        elif len(tokens) != self._length:
            return False
        for wanted, token in zip(self._head, tokens, strict=False):
            if wanted != token and wanted != SINGLE_WILDCARD:
                return False
        return True

    def __repr__(self) -> str:
        return f"SubjectPattern({self.text!r})"


def subject_matches(pattern: str, subject: str) -> bool:
    """One-off match of `subject` against `pattern` (compile a SubjectPattern for repeated use)."""
    return SubjectPattern(pattern).matches(subject, subject.split("."))


# Called as (subject, message); result subscriptions wrap their one-argument handler.
_Callback = Callable[[str, Any], Any]


class BusSubscription:
    """One handler on one subject pattern; `unsubscribe` stops delivery at once."""

    __slots__ = ("pattern", "callback", "active", "_bus")

    def __init__(self, bus: LoopbackBus, pattern: SubjectPattern, callback: _Callback) -> None:
        self.pattern = pattern
        self.callback = callback
        self.active = True
        self._bus = bus

    async def unsubscribe(self) -> None:
        """Stop delivering to the handler; a second call does nothing."""
        if self.active:
            self.active = False
            self._bus.remove(self)


class LoopbackBus:
    """Subscriptions and dispatch; messages published here reach every matching subscription in order."""

    def __init__(self) -> None:
        self._subscriptions: list[BusSubscription] = []
        # Rebuilt on (un)subscribe so a publish never copies the list and handlers may unsubscribe.
        self._snapshot: tuple[BusSubscription, ...] = ()

    def add(self, pattern: str, callback: _Callback) -> BusSubscription:
        """Subscribe `callback(subject, message)` to `pattern` (NATS wildcards)."""
        subscription = BusSubscription(self, SubjectPattern(pattern), callback)
        self._subscriptions.append(subscription)
        self._snapshot = tuple(self._subscriptions)
        return subscription

    def remove(self, subscription: BusSubscription) -> None:
        """Forget one subscription (called by BusSubscription.unsubscribe)."""
        self._subscriptions.remove(subscription)
        self._snapshot = tuple(self._subscriptions)

    def clear(self) -> None:
        """Drop every subscription (the transport closed)."""
        for subscription in self._subscriptions:
            subscription.active = False
        self._subscriptions.clear()
        self._snapshot = ()

    async def dispatch(self, subject: str, message: Any) -> None:
        """Call each matching handler; awaitable returns are awaited before the next handler runs."""
        tokens: list[str] = []
        for subscription in self._snapshot:
            if not subscription.active:
                continue
            if subscription.pattern.literal is None and not tokens:
                tokens = subject.split(".")
            if subscription.pattern.matches(subject, tokens):
                await _call(subscription, subject, message)


async def _call(subscription: BusSubscription, subject: str, message: Any) -> None:
    try:
        outcome = subscription.callback(subject, message)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # noqa: BLE001 - a subscriber's bug must not reach the publisher or other subscribers
        logger.exception("bus handler for %r failed on subject %r", subscription.pattern.text, subject)
