"""NATS subject patterns for the loopback: `*` matches one token, `>` one or more trailing tokens.

Pure string logic, no state; the bus and the pool streams use it to route by subject.
"""

from __future__ import annotations

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
