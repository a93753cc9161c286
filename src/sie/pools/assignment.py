"""Which workers a pool is assigned (seed 000 §16.3: "HA gateways sort workers deterministically and persist
named-pool assignment status"): the same candidates and the same previous assignment give the same answer on every
gateway. Pure; the gateway picks the candidates (healthy, on the pool's queue pool) and persists the result.
"""

from __future__ import annotations

from collections.abc import Iterable

from sie.pools.pool import AssignedWorker
from sie.pools.spec import PoolSpec


def assign_workers(
    spec: PoolSpec, workers: Iterable[AssignedWorker], previous: Iterable[AssignedWorker]
) -> tuple[AssignedWorker, ...]:
    """The workers `spec` is assigned, sorted by worker id.

    Only candidates of the machine profiles the pool names (any profile when it names none) and of its bundle
    (when set) count. A profile without a cap in `spec.gpu_caps` is assigned every such candidate; a capped one at
    most cap workers: those in `previous` that are still candidates first (an assignment is sticky, so a sidecar
    keeps its admission while the pool is stable), then the others by worker id. A worker id that appears more
    than once counts once, as its first candidate."""
    profiles = spec.machine_profiles
    candidates: dict[str, AssignedWorker] = {}
    for worker in workers:
        if worker.name in candidates or (spec.bundle is not None and worker.bundle != spec.bundle):
            continue
        if profiles and worker.machine_profile not in profiles:
            continue
        candidates[worker.name] = worker
    kept = {worker.name for worker in previous}
    by_profile: dict[str, list[AssignedWorker]] = {}
    for worker in candidates.values():
        by_profile.setdefault(worker.machine_profile, []).append(worker)
    assigned: list[AssignedWorker] = []
    for profile, members in by_profile.items():
        cap = spec.gpu_caps.get(profile)
        members.sort(key=lambda worker: (worker.name not in kept, worker.name))
        assigned.extend(members if cap is None else members[:cap])
    return tuple(sorted(assigned, key=lambda worker: worker.name))
