"""Trusted config producers: exact names and pod-name prefixes only."""

from __future__ import annotations

import pytest

from sie.catalog.trust import is_trusted_producer


@pytest.mark.parametrize(
    ("producer", "trusted"),
    [
        ("sie-config", True),
        ("sie-config-5f7b6d8c-kxwvr", True),
        ("sie-config-0", True),
        ("sie-configuration", False),
        ("sie-config-Evil", False),
        ("sie-config-", False),
        ("mallory", False),
    ],
)
def test_allowlist(producer: str, trusted: bool) -> None:
    assert is_trusted_producer(producer, ["sie-config"]) is trusted


def test_trust_any() -> None:
    assert is_trusted_producer("anyone", [], trust_any=True)
