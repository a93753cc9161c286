"""Which producers may publish config deltas (seed 000 §4.3): exact names or Kubernetes pod-name prefixes."""

from __future__ import annotations

import re
from collections.abc import Iterable

# A pod of Deployment `sie-config` is `sie-config-<replicaset hash>-<suffix>`; a StatefulSet pod is `sie-config-N`.
_POD_SUFFIX = re.compile(r"^-(?:[a-z0-9]{5,10}-[a-z0-9]{5}|\d+)$")


def is_trusted_producer(producer: str, allowlist: Iterable[str], trust_any: bool = False) -> bool:
    """True when `producer` equals an allowed name or is a pod of it (`sie-config` trusts
    `sie-config-5f7b6d8c-kxwvr` and `sie-config-0`, not `sie-configuration`)."""
    if trust_any:
        return True
    for allowed in allowlist:
        if producer == allowed:
            return True
        if producer.startswith(allowed) and _POD_SUFFIX.match(producer[len(allowed) :]):
            return True
    return False
