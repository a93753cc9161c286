"""Worker assignment (seed 000 §16.3): uncapped profiles take every candidate, capped ones keep their previous
workers first and then fill by worker id, so every gateway computes the same assignment from the same inputs."""

from __future__ import annotations

import itertools

from sie.pools import AssignedWorker, PoolSpec, assign_workers


def worker(name: str, profile: str = "l4", bundle: str = "default", gpus: int = 1) -> AssignedWorker:
    return AssignedWorker(name=name, machine_profile=profile, bundle=bundle, gpus=gpus)


def names(workers: tuple[AssignedWorker, ...]) -> list[str]:
    return [assigned.name for assigned in workers]


L4_WORKERS = [worker(f"l4-{index}") for index in (3, 1, 4, 2)]
A100_WORKERS = [worker(f"a100-{index}", "a100") for index in (2, 1)]


def test_an_uncapped_profile_is_assigned_every_candidate_sorted_by_id() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 2})
    assert names(assign_workers(spec, L4_WORKERS, ())) == ["l4-1", "l4-2", "l4-3", "l4-4"]


def test_only_the_profiles_the_pool_names_count() -> None:
    spec = PoolSpec(name="acme", gpus={"a100": 1})
    assert names(assign_workers(spec, L4_WORKERS + A100_WORKERS, ())) == ["a100-1", "a100-2"]


def test_a_pool_that_names_no_profile_takes_every_candidate() -> None:
    spec = PoolSpec(name="default", gpus={})
    assert len(assign_workers(spec, L4_WORKERS + A100_WORKERS, ())) == 6


def test_a_capped_profile_fills_by_worker_id() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 1, "a100": 1}, gpu_caps={"l4": 2})
    assigned = assign_workers(spec, L4_WORKERS + A100_WORKERS, ())
    assert names(assigned) == ["a100-1", "a100-2", "l4-1", "l4-2"]


def test_a_capped_profile_keeps_its_previous_workers_while_they_are_candidates() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 1}, gpu_caps={"l4": 2})
    previous = (worker("l4-3"), worker("l4-4"))
    assert names(assign_workers(spec, L4_WORKERS, previous)) == ["l4-3", "l4-4"]
    still_there = [candidate for candidate in L4_WORKERS if candidate.name != "l4-4"]
    assert names(assign_workers(spec, still_there, previous)) == ["l4-1", "l4-3"]


def test_a_lowered_cap_drops_previous_workers_by_id() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 1}, gpu_caps={"l4": 1})
    previous = (worker("l4-3"), worker("l4-4"))
    assert names(assign_workers(spec, L4_WORKERS, previous)) == ["l4-3"]


def test_a_cap_of_zero_assigns_none_of_that_profile() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 1, "a100": 1}, gpu_caps={"l4": 0})
    assert names(assign_workers(spec, L4_WORKERS + A100_WORKERS, ())) == ["a100-1", "a100-2"]


def test_every_order_of_the_same_candidates_gives_the_same_assignment() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 1, "a100": 1}, gpu_caps={"l4": 3, "a100": 1})
    previous = (worker("l4-4"),)
    answers = {
        assign_workers(spec, list(order), previous)
        for order in itertools.permutations(L4_WORKERS + A100_WORKERS[:1] + [worker("a100-0", "a100")])
    }
    assert len(answers) == 1
    assert names(answers.pop()) == ["a100-0", "l4-1", "l4-2", "l4-4"]


def test_the_bundle_filter_applies_when_set() -> None:
    candidates = [worker("w-1", bundle="default"), worker("w-2", bundle="sglang")]
    assert names(assign_workers(PoolSpec(name="acme", gpus={"l4": 1}, bundle="sglang"), candidates, ())) == ["w-2"]
    assert names(assign_workers(PoolSpec(name="acme", gpus={"l4": 1}), candidates, ())) == ["w-1", "w-2"]


def test_the_current_candidate_is_recorded_and_a_repeated_id_counts_once() -> None:
    spec = PoolSpec(name="acme", gpus={"l4": 1}, gpu_caps={"l4": 2})
    candidates = [worker("l4-1", gpus=4), worker("l4-1", gpus=2), worker("l4-2")]
    assigned = assign_workers(spec, candidates, (worker("l4-1", gpus=1),))
    assert assigned == (worker("l4-1", gpus=4), worker("l4-2"))
