"""A pool as the gateway keeps it (seed 000 §16.3): its spec, its lease (created, last renewed, expires) and the
workers assigned to it, and the one JSON shape the gateway answers with, the stores keep, and the sidecar and the
CLI read back. Pure: times are unix seconds passed in, never read here.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from sie.pools.spec import DEFAULT_POOL, InvalidPoolError, PoolSpec, canonical_pool_name

PoolState = Literal["pending", "active", "expired"]


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen(kw_only=True)
class AssignedWorker:
    """A worker assigned to a pool: its worker id, the machine profile and bundle it serves and its device count."""

    name: str
    machine_profile: str
    bundle: str
    gpus: int = attrs.field(default=1, validator=_at_least_one)


@attrs.frozen(kw_only=True)
class Pool:
    """One pool: `expires_at` None never expires (the protected pools); `protected` pools are the deployment's
    (the default pool and the static queue pools) and cannot be deleted or replaced."""

    spec: PoolSpec
    created_at: float
    last_renewed: float
    expires_at: float | None
    assigned_workers: tuple[AssignedWorker, ...] = attrs.field(default=(), converter=tuple)
    protected: bool = False

    @classmethod
    def leased(cls, spec: PoolSpec, now: float) -> Pool:
        """A new pool created at `now`, its lease running `spec.ttl_seconds` (None: forever)."""
        return cls(spec=spec, created_at=now, last_renewed=now, expires_at=_expiry(spec, now))

    @classmethod
    def protected_queue_pool(cls, name: str, now: float) -> Pool:
        """The default pool or a static queue pool: no requirements, no caps, never expires, cannot be deleted."""
        spec = PoolSpec(name=name, queue_pool=name, gpus={})
        return cls(spec=spec, created_at=now, last_renewed=now, expires_at=None, protected=True)

    @property
    def name(self) -> str:
        return self.spec.name

    def expired(self, now: float) -> bool:
        """Whether the lease ran out at or before `now`."""
        return self.expires_at is not None and now >= self.expires_at

    def state(self, now: float) -> PoolState:
        """`expired` once the lease ran out; `active` when assigned workers serve at least one machine profile
        the pool requires (any worker, for a pool that requires none), and always for protected pools; else
        `pending`."""
        if self.expired(now):
            return "expired"
        if self.protected or self._covered():
            return "active"
        return "pending"

    def renewed(self, now: float) -> Pool:
        """This pool with its lease renewed at `now` (a renewal never moves the lease backwards)."""
        if now <= self.last_renewed:
            return self
        return attrs.evolve(self, last_renewed=now, expires_at=_expiry(self.spec, now))

    def to_json(self, now: float) -> dict[str, Any]:
        """The pool's JSON shape (contracts "Pools:", extended): spec, status (state at `now`, assigned workers,
        unix times, as the public SDK types them) and whether it is protected."""
        spec = self.spec
        return {
            "spec": {
                "name": spec.name,
                "bundle": spec.bundle,
                "gpus": dict(spec.gpus),
                "gpu_caps": dict(spec.gpu_caps),
                "queue_pool": spec.queue_pool,
                "ttl_seconds": spec.ttl_seconds,
                "minimum_worker_count": spec.minimum_worker_count,
                "pinned_models": list(spec.pinned_models),
            },
            "status": {
                "state": self.state(now),
                "assigned_workers": [_worker_json(worker) for worker in self.assigned_workers],
                "created_at": self.created_at,
                "last_renewed": self.last_renewed,
                "expires_at": self.expires_at,
            },
            "protected": self.protected,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pool:
        """A pool read back from its JSON shape; unknown fields are ignored, `status.state` is recomputed from
        the times. InvalidPoolError names what is missing or malformed."""
        try:
            spec, status = data["spec"], data["status"]
            expires_at = status.get("expires_at")
            return cls(
                spec=_spec_from_json(spec),
                created_at=_unix(status["created_at"]),
                last_renewed=_unix(status["last_renewed"]),
                expires_at=None if expires_at is None else _unix(expires_at),
                assigned_workers=tuple(_worker_from_json(worker) for worker in status.get("assigned_workers") or ()),
                protected=data.get("protected", False) is True,
            )
        except InvalidPoolError as exc:
            raise InvalidPoolError(f"malformed pool JSON: {exc.message}") from exc
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidPoolError(f"malformed pool JSON: {type(exc).__name__}: {exc}") from exc

    def _covered(self) -> bool:
        if not self.spec.gpus:
            return bool(self.assigned_workers)
        return any(worker.machine_profile in self.spec.gpus for worker in self.assigned_workers)


def replacement(stored: Pool, new: Pool) -> Pool:
    """What `PoolStore.replace(new)` writes over `stored`: spec, assigned workers and protection from `new`, the
    creation time from `stored`, and the lease of whichever was renewed later, so that a replace computed from an
    older read never undoes a renewal made meanwhile (by this gateway or another)."""
    lease = stored if stored.last_renewed > new.last_renewed else new
    return attrs.evolve(new, created_at=stored.created_at, last_renewed=lease.last_renewed, expires_at=lease.expires_at)


def _expiry(spec: PoolSpec, now: float) -> float | None:
    return None if spec.ttl_seconds is None else now + spec.ttl_seconds


def _worker_json(worker: AssignedWorker) -> dict[str, Any]:
    # `url` and `gpu` keep the public SDK's AssignedWorkerInfo shape: workers are reached through NATS, not a URL.
    return {
        "name": worker.name,
        "url": "",
        "gpu": worker.machine_profile,
        "machine_profile": worker.machine_profile,
        "bundle": worker.bundle,
        "gpus": worker.gpus,
    }


def _worker_from_json(data: Mapping[str, Any]) -> AssignedWorker:
    return AssignedWorker(
        name=_text(data["name"]),
        machine_profile=_text(data.get("machine_profile") or data["gpu"]),
        bundle=_text(data.get("bundle") or ""),
        gpus=_whole(data.get("gpus", 1)),
    )


def _spec_from_json(data: Mapping[str, Any]) -> PoolSpec:
    ttl = data.get("ttl_seconds")
    bundle = data.get("bundle")
    return PoolSpec(
        name=canonical_pool_name(data["name"]),
        queue_pool=canonical_pool_name(data.get("queue_pool") or DEFAULT_POOL),
        gpus=_counts_from_json(data.get("gpus")),
        gpu_caps=_counts_from_json(data.get("gpu_caps")),
        bundle=None if bundle is None else _text(bundle),
        minimum_worker_count=_whole(data.get("minimum_worker_count") or 0),
        pinned_models=tuple(_text(model) for model in data.get("pinned_models") or ()),
        ttl_seconds=None if ttl is None else _seconds(ttl),
    )


def _counts_from_json(data: Mapping[str, Any] | None) -> dict[str, int]:
    return {_text(profile): _whole(count) for profile, count in (data or {}).items()}


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {value!r}")
    return value


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"expected a number of seconds, got {value!r}")
    return float(value)


def _unix(value: object) -> float:
    """Unix seconds (the public SDK's `PoolStatusInfo` types them so), or an ISO 8601 time."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _seconds(value)
    moment = datetime.datetime.fromisoformat(_text(value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
