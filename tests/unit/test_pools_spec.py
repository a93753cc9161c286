"""Pool names and `POST /v1/pools` bodies (seed 000 §16.3): canonical lower-case names of [A-Za-z0-9_-]{1,63},
unknown fields refused, counts and lease lengths range-checked, and each error naming what was wrong."""

from __future__ import annotations

from typing import Any

import pytest

from sie.pools import (
    DEFAULT_POOL,
    InvalidPoolError,
    PoolConflictError,
    PoolError,
    PoolExistsError,
    PoolNotFoundError,
    PoolProtectedError,
    PoolSpec,
    canonical_pool_name,
    parse_pool_spec,
)

DEFAULT_TTL_S = 300.0
DAY_S = 86400.0


def body(**fields: Any) -> dict[str, Any]:
    return {"name": "acme", "gpus": {"l4": 1}, **fields}


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidPoolError, "INVALID_POOL"),
        (PoolNotFoundError, "POOL_NOT_FOUND"),
        (PoolExistsError, "POOL_EXISTS"),
        (PoolProtectedError, "POOL_PROTECTED"),
        (PoolConflictError, "POOL_CONFLICT"),
    ],
)
def test_each_error_is_a_pool_error_with_its_wire_code_and_message(error: type[PoolError], code: str) -> None:
    raised = error("pool 'acme': something")
    assert isinstance(raised, PoolError)
    assert (raised.code, raised.message, str(raised)) == (code, "pool 'acme': something", "pool 'acme': something")


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("acme", "acme"), ("Customer-ACME_2", "customer-acme_2"), ("x", "x"), ("A" * 63, "a" * 63)],
)
def test_pool_names_are_lower_cased(name: str, canonical: str) -> None:
    assert canonical_pool_name(name) == canonical


@pytest.mark.parametrize("name", ["", "a" * 64, "acme pool", "acme.pool", "acme/l4", "pööl", " acme", None, 7, ["a"]])
def test_a_name_outside_the_rules_is_refused_by_name(name: object) -> None:
    with pytest.raises(InvalidPoolError, match="invalid pool name") as caught:
        canonical_pool_name(name)
    assert repr(name) in caught.value.message


def test_a_minimal_body_takes_the_defaults() -> None:
    spec = parse_pool_spec({"name": "Acme", "gpus": {"L4": 2}}, DEFAULT_TTL_S)
    assert spec == PoolSpec(name="acme", queue_pool=DEFAULT_POOL, gpus={"l4": 2}, ttl_seconds=DEFAULT_TTL_S)
    assert (spec.gpu_caps, spec.bundle, spec.minimum_worker_count, spec.pinned_models) == ({}, None, 0, ())


def test_a_full_body_is_canonicalised() -> None:
    spec = parse_pool_spec(
        {
            "name": "Customer-Acme",
            "gpus": {"L4-Spot": 2, "a100-80gb": 1},
            "gpu_caps": {"l4-spot": 4},
            "bundle": "SGLang",
            "queue_pool": "Customer-ACME",
            "ttl_seconds": 3600,
            "minimum_worker_count": 1,
            "pinned_models": ["BAAI/bge-m3", "intfloat/e5:query", "BAAI/bge-m3"],
        },
        DEFAULT_TTL_S,
    )
    assert spec == PoolSpec(
        name="customer-acme",
        queue_pool="customer-acme",
        gpus={"a100-80gb": 1, "l4-spot": 2},
        gpu_caps={"l4-spot": 4},
        bundle="sglang",
        minimum_worker_count=1,
        pinned_models=("BAAI/bge-m3", "intfloat/e5:query"),
        ttl_seconds=3600.0,
    )
    assert spec.machine_profiles == {"a100-80gb", "l4-spot"}


def test_explicit_nulls_read_as_absent() -> None:
    spec = parse_pool_spec(
        body(gpu_caps=None, bundle=None, queue_pool=None, ttl_seconds=None, minimum_worker_count=None,
             pinned_models=None),
        DEFAULT_TTL_S,
    )  # fmt: skip
    assert spec == PoolSpec(name="acme", gpus={"l4": 1}, ttl_seconds=DEFAULT_TTL_S)


@pytest.mark.parametrize("ttl", [1, 1.5, 3600, 30 * DAY_S])
def test_a_lease_lies_from_one_second_to_thirty_days(ttl: float) -> None:
    assert parse_pool_spec(body(ttl_seconds=ttl), DEFAULT_TTL_S).ttl_seconds == float(ttl)


@pytest.mark.parametrize("ttl", [0, 0.5, -60, 30 * DAY_S + 1, float("inf"), float("nan"), "60", True, [60]])
def test_a_lease_outside_the_range_or_not_a_number_is_refused(ttl: object) -> None:
    with pytest.raises(InvalidPoolError, match="'ttl_seconds'"):
        parse_pool_spec(body(ttl_seconds=ttl), DEFAULT_TTL_S)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"gpus": None}, "'gpus' must name at least one"),
        ({"gpus": {}}, "'gpus' must name at least one"),
        ({"gpus": ["l4"]}, "'gpus' maps machine profiles to counts, got list"),
        ({"gpus": {"l4": 0}}, r"'gpus\[l4\]' must be a whole number from 1"),
        ({"gpus": {"l4": -1}}, r"'gpus\[l4\]'"),
        ({"gpus": {"l4": 1.5}}, r"'gpus\[l4\]'"),
        ({"gpus": {"l4": True}}, r"'gpus\[l4\]'"),
        ({"gpus": {"l4": "2"}}, r"'gpus\[l4\]'"),
        ({"gpus": {"l4": None}}, r"'gpus\[l4\]'"),
        ({"gpus": {"l4": 10**9}}, r"'gpus\[l4\]'"),
        ({"gpus": {"l4 spot": 1}}, "invalid machine profile in 'gpus' 'l4 spot'"),
        ({"gpus": {"L4": 1, "l4": 2}}, "names machine profile 'l4' twice"),
        ({"gpu_caps": {"a100": 1}}, r"'gpu_caps' caps machine profiles \['a100'\] that 'gpus' does not require"),
        ({"gpu_caps": {"l4": -1}}, r"'gpu_caps\[l4\]' must be a whole number from 0"),
        ({"gpu_caps": 4}, "'gpu_caps' maps machine profiles to counts, got int"),
        ({"minimum_worker_count": -1}, "'minimum_worker_count'"),
        ({"minimum_worker_count": 1.0}, "'minimum_worker_count'"),
        ({"minimum_worker_count": False}, "'minimum_worker_count'"),
        ({"bundle": "my bundle"}, "invalid bundle 'my bundle'"),
        ({"bundle": 3}, "invalid bundle 3"),
        ({"queue_pool": "a.b"}, "invalid queue_pool 'a.b'"),
        ({"pinned_models": "BAAI/bge-m3"}, "'pinned_models' must be a list of model ids"),
        ({"pinned_models": ["ok", ""]}, "'pinned_models' must be a list of model ids"),
        ({"pinned_models": [3]}, "'pinned_models' must be a list of model ids"),
        ({"name": "bad name"}, "invalid pool name 'bad name'"),
        ({"name": None}, "invalid pool name None"),
    ],
)
def test_a_bad_field_is_refused_by_name(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidPoolError, match=named):
        parse_pool_spec(body(**fields), DEFAULT_TTL_S)


def test_a_cap_of_zero_is_allowed() -> None:
    assert parse_pool_spec(body(gpu_caps={"L4": 0}), DEFAULT_TTL_S).gpu_caps == {"l4": 0}


def test_unknown_fields_are_refused_and_listed() -> None:
    with pytest.raises(InvalidPoolError, match=r"unknown pool spec fields \['gpu', 'ttl'\]"):
        parse_pool_spec(body(ttl=60, gpu="l4"), DEFAULT_TTL_S)


def test_a_body_without_a_name_or_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidPoolError, match="needs a 'name'"):
        parse_pool_spec({"gpus": {"l4": 1}}, DEFAULT_TTL_S)
    with pytest.raises(InvalidPoolError, match="a pool spec is a JSON object, got list"):
        parse_pool_spec([("name", "acme")], DEFAULT_TTL_S)  # type: ignore[arg-type]


def test_a_spec_built_in_code_is_canonical_too() -> None:
    spec = PoolSpec(name="ACME", queue_pool="Default", gpus={"l4": 1, "a100": 2})
    assert (spec.name, spec.queue_pool, list(spec.gpus)) == ("acme", "default", ["a100", "l4"])
    with pytest.raises(InvalidPoolError):
        PoolSpec(name="no such name", gpus={})
