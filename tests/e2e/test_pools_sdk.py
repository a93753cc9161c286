"""The public sie-sdk's pool calls against a real gateway (seed 000 §16.3; contracts "Pools:"): `create_pool`,
`get_pool`, `delete_pool`, a re-POST that updates a live pool, and an encode routed through the pool with
`gpu="pool/profile"`. The server is a `sie run --role all --backend null` of this module's own, with an admin
token the SDK sends as its api_key (pool writes are admin routes). Marked slow: it starts a real server process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from launcher import serving_all

pytestmark = pytest.mark.slow

ADMIN_TOKEN = "adm1n"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
POOL = "sdk-eval"
LEASE_THREAD = f"pool-lease-{POOL}"  # the SDK's lease-renewal thread for the pool


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of an all-in-one server (null backend: one worker on machine profile `default`); it must exit
    0 on SIGTERM."""
    log = tmp_path_factory.mktemp("sdk") / "all.log"
    with serving_all(log, ["--backend", "null", "--devices", "cpu"], {"SIE_ADMIN_TOKEN": ADMIN_TOKEN}) as url:
        yield url


def lease_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == LEASE_THREAD and thread.is_alive()]


def test_create_get_update_route_and_delete_a_pool(gateway: str, public_sdk) -> None:
    (worker,) = httpx.get(f"{gateway}/health", timeout=10).json()["workers"]
    profile = worker["machine_profile"]
    client = public_sdk.SIEClient(gateway, api_key=ADMIN_TOKEN)
    try:
        assert client.create_pool(POOL, gpus={profile: 1}) is None
        assert len(lease_threads()) == 1  # the SDK renews the lease in the background
        created = client.get_pool(POOL)
        assert created is not None and set(created) == set(public_sdk.PoolInfo.__annotations__)
        assert created["name"] == POOL
        assert created["spec"]["gpus"] == {profile: 1} and created["spec"]["gpu_caps"] == {}
        status = created["status"]
        assert set(public_sdk.types.PoolStatusInfo.__annotations__) <= set(status)
        assert isinstance(status["created_at"], float) and isinstance(status["last_renewed"], float)
        # The worker serves the pool's machine profile on the default queue pool: it is assigned, the pool active.
        assert status["state"] == "active"
        assigned = status["assigned_workers"]
        assert [(w["name"], w["gpu"]) for w in assigned] == [(worker["name"], profile)]
        assert set(public_sdk.types.AssignedWorkerInfo.__annotations__) <= set(assigned[0])

        client.create_pool(POOL, gpus={profile: 2}, gpu_caps={profile: 1}, minimum_worker_count=1)
        updated = client.get_pool(POOL)
        assert updated is not None
        assert (updated["spec"]["gpus"], updated["spec"]["gpu_caps"]) == ({profile: 2}, {profile: 1})
        assert updated["spec"]["minimum_worker_count"] == 1
        assert updated["status"]["created_at"] == status["created_at"]  # the same pool, updated
        assert updated["status"]["last_renewed"] >= status["last_renewed"]
        assert len(lease_threads()) == 1  # a re-POST does not start a second renewal

        routed = client.encode(MINILM, {"text": "hello"}, gpu=f"{POOL}/{profile}")
        assert routed["model"] == MINILM and len(routed["dense"]) > 0
        with pytest.raises(public_sdk.RequestError, match="not found"):
            client.encode(MINILM, {"text": "hello"}, gpu=f"nobody/{profile}")  # a named pool fails closed

        assert client.delete_pool(POOL) is True
        assert lease_threads() == []  # deleting the pool stops its renewal
        assert client.get_pool(POOL) is None
        assert client.delete_pool(POOL) is False
        with pytest.raises(public_sdk.RequestError, match="not found"):
            client.encode(MINILM, {"text": "hello"}, gpu=f"{POOL}/{profile}")
    finally:
        client.close()


def test_closing_the_client_stops_its_lease_renewal(gateway: str, public_sdk) -> None:
    with public_sdk.SIEClient(gateway, api_key=ADMIN_TOKEN) as client:
        client.create_pool(POOL, gpus={"default": 1})
        assert len(lease_threads()) == 1
    assert lease_threads() == []
    # The pool outlives the client (the gateway's lease, not the client, ends it); delete it.
    with public_sdk.SIEClient(gateway, api_key=ADMIN_TOKEN) as client:
        assert client.get_pool(POOL) is not None
        assert client.delete_pool(POOL) is True


def test_pool_writes_without_the_admin_token_raise_pool_error(gateway: str, public_sdk) -> None:
    with public_sdk.SIEClient(gateway) as client:
        with pytest.raises(public_sdk.PoolError, match="admin token"):
            client.create_pool(POOL, gpus={"default": 1})
        assert lease_threads() == []
        assert client.get_pool(POOL) is None  # reads are open: the gateway is not in token mode
