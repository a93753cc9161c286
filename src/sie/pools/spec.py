"""What a pool asks for (seed 000 §16.3): pool names and their canonical form, the PoolSpec a `POST /v1/pools` body
becomes, and the errors every pool surface maps to its envelope. Pure: no I/O, no HTTP status codes.

    PoolError                 .code, .message
    ├── InvalidPoolError      INVALID_POOL: a bad name or pool spec
    ├── PoolNotFoundError     POOL_NOT_FOUND: no live pool of that name
    ├── PoolExistsError       POOL_EXISTS: a live pool already has that name
    ├── PoolProtectedError    POOL_PROTECTED: the default pool and static queue pools cannot be deleted or replaced
    └── PoolConflictError     POOL_CONFLICT: other writers kept changing the pool; try again
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import attrs

DEFAULT_POOL: Final = "default"
MAX_NAME_LENGTH: Final = 63
MIN_TTL_S: Final = 1.0
MAX_TTL_S: Final = 30 * 86400.0
# Counts (GPUs, worker caps, the warm floor) above this are typos, not capacity anyone runs.
MAX_COUNT: Final = 100_000

_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")
_BODY_KEYS: Final = frozenset(
    {"name", "gpus", "gpu_caps", "bundle", "queue_pool", "ttl_seconds", "minimum_worker_count", "pinned_models"}
)


class PoolError(Exception):
    """Base class of pool errors: `code` names the failure on the wire, `message` explains it."""

    code: ClassVar[str] = "POOL_ERROR"

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class InvalidPoolError(PoolError):
    """A pool name or pool spec breaks the rules."""

    code = "INVALID_POOL"


class PoolNotFoundError(PoolError):
    """No live pool has that name (never created, deleted, or its lease expired)."""

    code = "POOL_NOT_FOUND"


class PoolExistsError(PoolError):
    """A live pool already has that name."""

    code = "POOL_EXISTS"


class PoolProtectedError(PoolError):
    """The default pool and the static queue pools belong to the deployment: they cannot be deleted or replaced."""

    code = "POOL_PROTECTED"


class PoolConflictError(PoolError):
    """Other writers changed the pool on every attempt to write it (compare-and-set lost each time); retry."""

    code = "POOL_CONFLICT"


def canonical_pool_name(name: Any) -> str:
    """`name` lower-cased, after checking it is 1-63 characters of [A-Za-z0-9_-]; InvalidPoolError otherwise."""
    return _canonical_token(name, "pool name")


def _canonical_token(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidPoolError(
            f"invalid {what} {value!r}: expected 1-{MAX_NAME_LENGTH} characters from A-Z a-z 0-9 _ -"
        )
    return value.lower()


def _counts(value: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(value.items()))


@attrs.frozen(kw_only=True)
class PoolSpec:
    """A logical pool: its name, the physical queue pool behind it, the capacity it needs per machine profile
    (`gpus`, GPUs), how many workers of a profile it may be assigned (`gpu_caps`; a profile without a cap takes
    every candidate), an optional bundle filter, a warm floor, models kept loaded and its lease length (None:
    the pool never expires, as the protected pools)."""

    name: str = attrs.field(converter=canonical_pool_name)
    queue_pool: str = attrs.field(default=DEFAULT_POOL, converter=canonical_pool_name)
    gpus: Mapping[str, int] = attrs.field(converter=_counts)
    gpu_caps: Mapping[str, int] = attrs.field(factory=dict, converter=_counts)
    bundle: str | None = None
    minimum_worker_count: int = 0
    pinned_models: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    ttl_seconds: float | None = None

    @property
    def machine_profiles(self) -> frozenset[str]:
        """The machine profiles this pool takes workers of; empty: every profile (the protected pools)."""
        return frozenset(self.gpus) | frozenset(self.gpu_caps)


def parse_pool_spec(body: Mapping[str, Any], default_ttl_s: float) -> PoolSpec:
    """The PoolSpec of a `POST /v1/pools` body; InvalidPoolError naming the first bad field.

    Unknown keys are refused; names, machine profiles and the bundle are canonicalised to lower case; `gpus` must
    name at least one machine profile with a positive GPU count; `gpu_caps` may only cap profiles `gpus` names;
    `ttl_seconds` lies in 1 s..30 days (absent or null: `default_ttl_s`)."""
    if not isinstance(body, Mapping):
        raise InvalidPoolError(f"a pool spec is a JSON object, got {type(body).__name__}")
    unknown = sorted(str(key) for key in body if key not in _BODY_KEYS)
    if unknown:
        raise InvalidPoolError(f"unknown pool spec fields {unknown}; allowed: {sorted(_BODY_KEYS)}")
    if "name" not in body:
        raise InvalidPoolError("a pool spec needs a 'name'")
    gpus = _profile_counts(body.get("gpus"), "gpus", minimum=1)
    if not gpus:
        raise InvalidPoolError("'gpus' must name at least one machine profile, e.g. {\"l4\": 1}")
    gpu_caps = _profile_counts(body.get("gpu_caps"), "gpu_caps", minimum=0)
    uncapped = sorted(set(gpu_caps) - set(gpus))
    if uncapped:
        raise InvalidPoolError(f"'gpu_caps' caps machine profiles {uncapped} that 'gpus' does not require")
    bundle = body.get("bundle")
    queue_pool = body.get("queue_pool")
    floor = body.get("minimum_worker_count")
    return PoolSpec(
        name=canonical_pool_name(body["name"]),
        queue_pool=DEFAULT_POOL if queue_pool is None else _canonical_token(queue_pool, "queue_pool"),
        gpus=gpus,
        gpu_caps=gpu_caps,
        bundle=None if bundle is None else _canonical_token(bundle, "bundle"),
        minimum_worker_count=0 if floor is None else _count(floor, "minimum_worker_count", minimum=0),
        pinned_models=_model_ids(body.get("pinned_models")),
        ttl_seconds=_ttl(body.get("ttl_seconds"), default_ttl_s),
    )


def _profile_counts(value: object, field: str, *, minimum: int) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPoolError(f"'{field}' maps machine profiles to counts, got {type(value).__name__}")
    counts: dict[str, int] = {}
    for raw_profile, raw_count in value.items():
        profile = _canonical_token(raw_profile, f"machine profile in '{field}'")
        if profile in counts:
            raise InvalidPoolError(f"'{field}' names machine profile {profile!r} twice (names ignore case)")
        counts[profile] = _count(raw_count, f"{field}[{profile}]", minimum=minimum)
    return counts


def _count(value: object, field: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise InvalidPoolError(f"'{field}' must be a whole number from {minimum} to {MAX_COUNT}, got {value!r}")
    return value


def _model_ids(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(model, str) and model.strip() for model in value):
        raise InvalidPoolError(f"'pinned_models' must be a list of model ids, got {value!r}")
    return tuple(dict.fromkeys(model.strip() for model in value))


def _ttl(value: object, default_ttl_s: float) -> float:
    if value is None:
        return default_ttl_s
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidPoolError(f"'ttl_seconds' must be a number of seconds, got {value!r}")
    if not MIN_TTL_S <= value <= MAX_TTL_S:
        raise InvalidPoolError(f"'ttl_seconds' must lie from {MIN_TTL_S:g} to {MAX_TTL_S:g} (30 days), got {value!r}")
    return float(value)
