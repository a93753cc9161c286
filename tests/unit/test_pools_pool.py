"""A pool's lease, state and JSON shape (contracts "Pools:", extended): the shape the gateway answers with, the
stores keep and the sidecar and `sie pools` read back with Pool.from_json."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from sie.pools import AssignedWorker, InvalidPoolError, Pool, PoolSpec, replacement

T0 = 1_700_000_000.0
SPEC = PoolSpec(name="acme", gpus={"l4": 2}, gpu_caps={"l4": 4}, bundle="default", minimum_worker_count=1,
                pinned_models=("BAAI/bge-m3",), ttl_seconds=60.0)  # fmt: skip
L4 = AssignedWorker(name="worker-1", machine_profile="l4", bundle="default", gpus=1)
A100 = AssignedWorker(name="worker-2", machine_profile="a100", bundle="default", gpus=8)


def test_a_new_lease_runs_its_ttl_from_now() -> None:
    pool = Pool.leased(SPEC, T0)
    assert (pool.created_at, pool.last_renewed, pool.expires_at, pool.protected) == (T0, T0, T0 + 60, False)
    assert not pool.expired(T0 + 59.999)
    assert pool.expired(T0 + 60)


def test_state_is_pending_until_a_required_profile_has_a_worker_and_expired_after_the_lease() -> None:
    pool = Pool.leased(SPEC, T0)
    assert pool.state(T0) == "pending"
    assert attrs.evolve(pool, assigned_workers=(A100,)).state(T0) == "pending"  # a100 is not required
    assert attrs.evolve(pool, assigned_workers=(L4,)).state(T0) == "active"
    assert attrs.evolve(pool, assigned_workers=(L4,)).state(T0 + 60) == "expired"


def test_protected_pools_are_active_and_never_expire() -> None:
    pool = Pool.protected_queue_pool("default", T0)
    assert (pool.spec.queue_pool, dict(pool.spec.gpus), pool.expires_at, pool.protected) == ("default", {}, None, True)
    assert pool.state(T0 + 10 * 365 * 86400) == "active"


def test_a_renewal_restarts_the_lease_and_never_moves_it_back() -> None:
    pool = Pool.leased(SPEC, T0)
    renewed = pool.renewed(T0 + 30)
    assert (renewed.created_at, renewed.last_renewed, renewed.expires_at) == (T0, T0 + 30, T0 + 90)
    assert renewed.renewed(T0 + 10) is renewed


def test_the_json_shape() -> None:
    pool = attrs.evolve(Pool.leased(SPEC, T0), assigned_workers=(L4,))
    assert pool.to_json(T0 + 1) == {
        "spec": {
            "name": "acme", "bundle": "default", "gpus": {"l4": 2}, "gpu_caps": {"l4": 4}, "queue_pool": "default",
            "ttl_seconds": 60.0, "minimum_worker_count": 1, "pinned_models": ["BAAI/bge-m3"],
        },
        "status": {
            "state": "active",
            "assigned_workers": [
                {"name": "worker-1", "url": "", "gpu": "l4", "machine_profile": "l4", "bundle": "default", "gpus": 1}
            ],
            "created_at": T0,
            "last_renewed": T0,
            "expires_at": T0 + 60,
        },
        "protected": False,
    }  # fmt: skip
    assert Pool.protected_queue_pool("default", T0).to_json(T0)["status"]["expires_at"] is None


@pytest.mark.parametrize(
    "pool",
    [
        attrs.evolve(Pool.leased(SPEC, T0 + 0.25), assigned_workers=(L4, A100)),
        Pool.protected_queue_pool("customer-acme", T0),
        Pool.leased(PoolSpec(name="bare", gpus={"cpu": 1}), T0),
    ],
)
def test_from_json_reads_back_what_to_json_wrote(pool: Pool) -> None:
    assert Pool.from_json(pool.to_json(T0)) == pool


def test_from_json_ignores_unknown_fields_and_reads_the_public_sdk_worker_shape() -> None:
    data: dict[str, Any] = Pool.leased(SPEC, T0).to_json(T0)
    data["name"] = "acme"
    data["status"]["assigned_workers"] = [{"name": "w", "url": "http://w:8080", "gpu": "l4", "bundle": "default"}]
    data["status"]["extra"] = {"anything": 1}
    assert Pool.from_json(data).assigned_workers == (AssignedWorker(name="w", machine_profile="l4", bundle="default"),)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data.pop("spec"),
        lambda data: data["status"].pop("created_at"),
        lambda data: data["status"].update(created_at="yesterday"),
        lambda data: data["spec"].update(name="not a name"),
        lambda data: data["spec"].update(gpus={"l4": "two"}),
        lambda data: data["status"].update(assigned_workers=[{"gpu": "l4"}]),
        lambda data: data["status"].update(assigned_workers=[{"name": "w", "gpu": "l4", "gpus": 0}]),
    ],
)
def test_malformed_json_is_an_invalid_pool(damage: Any) -> None:
    data = Pool.leased(SPEC, T0).to_json(T0)
    damage(data)
    with pytest.raises(InvalidPoolError, match="malformed pool JSON"):
        Pool.from_json(data)


def test_a_replacement_takes_the_new_spec_and_workers_and_the_later_lease() -> None:
    stored = Pool.leased(SPEC, T0).renewed(T0 + 50)  # renewed by another gateway after `stale` was read
    stale = attrs.evolve(Pool.leased(SPEC, T0), assigned_workers=(L4,))
    written = replacement(stored, stale)
    assert (written.assigned_workers, written.last_renewed, written.expires_at) == ((L4,), T0 + 50, T0 + 110)
    respec = Pool.leased(attrs.evolve(SPEC, ttl_seconds=600.0), T0 + 70)  # a re-POST: new spec, new lease
    written = replacement(stored, respec)
    assert (written.spec.ttl_seconds, written.created_at, written.expires_at) == (600.0, T0, T0 + 670)
