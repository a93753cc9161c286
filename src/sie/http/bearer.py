"""Bearer tokens as the gateway and the config service both read them (seed 000 §13; contracts Part A §2.4,
Part B §1.10): the token of an `Authorization` header, `Bearer x` or a raw `x`, and a constant-time test of
whether it is one of a set. Pure: no web framework, no settings.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


def bearer_token(header: str | None) -> str | None:
    """The token of `Bearer x` or a raw `x`; None when the header is absent or blank."""
    if header is None or not header.strip():
        return None
    scheme, _, rest = header.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest.strip() else header.strip()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_in(token: str, candidates: Iterable[str]) -> bool:
    """Whether `token` is one of `candidates`, in time that reveals neither which one matched nor any length:
    every candidate is compared, as digests of equal size."""
    presented = _digest(token)
    results = [hmac.compare_digest(presented, _digest(candidate)) for candidate in candidates]
    return any(results)
