"""NATS subject wildcard rules as the loopback applies them."""

from __future__ import annotations

import pytest

from sie.transport.loopback.bus import SubjectPattern, subject_matches


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("_INBOX.gw-1.>", "_INBOX.gw-1.r1", True),
        ("_INBOX.gw-1.>", "_INBOX.gw-1.r1.extra", True),
        ("_INBOX.gw-1.>", "_INBOX.gw-2.r1", False),
        ("_INBOX.gw-1.>", "_INBOX.gw-1", False),
        ("sie.work.p.*.*.*", "sie.work.p.l4.default.BAAI__bge-m3", True),
        ("sie.work.p.*.*.*", "sie.work.p.l4.default.BAAI__bge-m3.worker-1", False),
        ("sie.work.p.*.*.*", "sie.work.q.l4.default.m", False),
        ("sie.work.p.l4.default.*", "sie.work.p.l4.sglang.m", False),
        ("sie.health.*", "sie.health.w1", True),
        ("sie.health.*", "sie.health", False),
        (">", "anything.at.all", True),
        ("sie.config.models._all", "sie.config.models._all", True),
        ("sie.config.models._all", "sie.config.models.default", False),
        ("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>", "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.S.c", True),
    ],
)
def test_subject_matching(pattern: str, subject: str, expected: bool) -> None:
    assert subject_matches(pattern, subject) is expected


def test_a_pattern_without_wildcards_compares_as_one_string() -> None:
    assert SubjectPattern("a.b").literal == "a.b"
    assert SubjectPattern("a.*").literal is None


@pytest.mark.parametrize("pattern", ["", "a..b", "a.>.b", ".a"])
def test_invalid_patterns_are_rejected(pattern: str) -> None:
    with pytest.raises(ValueError, match="invalid subject pattern"):
        SubjectPattern(pattern)
