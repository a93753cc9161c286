"""Which producers may publish config deltas (seed 000 §4.3): exact names, or Kubernetes pod names of them."""

from __future__ import annotations

import re
from collections.abc import Iterable

# What follows `{name}-` in a pod name: lowercase DNS-label pieces (`5f7b6d8c-kxwvr`, `0`).
_POD_SUFFIX = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def is_trusted_producer(producer: str, allowlist: Iterable[str], trust_any: bool = False) -> bool:
    """True when `producer` equals an allowed name or is a pod of it (`sie-config` trusts
    `sie-config-5f7b6d8c-kxwvr` and `sie-config-0`, not `sie-configuration`); empty names never match."""
    if trust_any:
        return True
    for name in allowlist:
        if not name:
            continue
        if producer == name:
            return True
        if producer.startswith(f"{name}-") and _POD_SUFFIX.fullmatch(producer[len(name) + 1 :]):
            return True
    return False
