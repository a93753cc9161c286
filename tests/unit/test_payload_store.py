"""The payload store on a local directory (sie.stores.payload_store): put, bounded get, delete, plain keys only.
The same operations on S3 and GCS run against real servers in tests/integration/test_payload_offload.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie.stores.payload_store import (
    InvalidPayloadKeyError,
    PayloadNotFoundError,
    PayloadOverLimitError,
    PayloadStore,
    PayloadStoreError,
    open_payload_store,
)


@pytest.fixture()
def store(tmp_path: Path) -> PayloadStore:
    return PayloadStore(str(tmp_path / "payloads" / "nested"))


async def test_a_payload_round_trips_and_is_gone_once_deleted(store: PayloadStore, tmp_path: Path) -> None:
    await store.put("gw-1-7_0.bin", b"\x81\xa4text\xa5hello")
    assert await store.get("gw-1-7_0.bin", max_bytes=1024) == b"\x81\xa4text\xa5hello"
    assert (tmp_path / "payloads" / "nested" / "gw-1-7_0.bin").exists()
    await store.delete("gw-1-7_0.bin")
    assert not await store.exists("gw-1-7_0.bin")
    await store.delete("gw-1-7_0.bin")  # deleting twice is fine: cleanup is retried and raced
    with pytest.raises(PayloadNotFoundError):
        await store.get("gw-1-7_0.bin", max_bytes=1024)


async def test_a_put_replaces_what_was_there(store: PayloadStore) -> None:
    await store.put("k.bin", b"old old old")
    await store.put("k.bin", b"new")
    assert await store.get("k.bin", max_bytes=100) == b"new"


async def test_reads_are_bounded(store: PayloadStore) -> None:
    await store.put("big.bin", b"x" * 1000)
    assert len(await store.get("big.bin", max_bytes=1000)) == 1000
    with pytest.raises(PayloadOverLimitError, match="over 999 bytes"):
        await store.get("big.bin", max_bytes=999)


@pytest.mark.parametrize("key", ["../escape.bin", "a/b.bin", ".hidden", "..", "", "tab\there", "x" * 600, "a\\b"])
async def test_keys_that_are_not_plain_names_are_refused(store: PayloadStore, key: str) -> None:
    with pytest.raises(InvalidPayloadKeyError):
        await store.get(key, max_bytes=10)
    with pytest.raises(InvalidPayloadKeyError):
        await store.put(key, b"x")


def test_a_store_is_opened_only_for_a_supported_url(tmp_path: Path) -> None:
    assert open_payload_store(None) is None
    assert isinstance(open_payload_store(f"file://{tmp_path}"), PayloadStore)
    with pytest.raises(PayloadStoreError, match="not a local path"):
        PayloadStore("ftp://example/payloads")


async def test_a_local_store_does_not_follow_a_symbolic_link_at_a_key(tmp_path: Path) -> None:
    """Whoever can write the store's directory cannot make a sidecar read (or a gateway overwrite) another file by
    putting a link where a key will be."""
    store = PayloadStore(str(tmp_path / "payloads"))
    await store.put("real", b"payload")  # makes the directory
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a payload")
    (tmp_path / "payloads" / "linked").symlink_to(secret)
    with pytest.raises(PayloadStoreError, match="symbolic link"):
        await store.get("linked", max_bytes=1000)
    with pytest.raises(PayloadStoreError, match="symbolic link"):
        await store.put("linked", b"overwrite")
    assert secret.read_bytes() == b"not a payload"
    await store.delete("linked")  # removes the link, not its target
    assert secret.exists() and not await store.exists("linked")
    assert await store.get("real", max_bytes=1000) == b"payload"


async def test_the_sweep_deletes_payloads_older_than_the_age_and_keeps_the_rest(tmp_path: Path) -> None:
    """What a crashed gateway left: keys written long ago go, recent ones and files that are no key stay."""
    import os
    import time

    store = PayloadStore(str(tmp_path / "payloads"))
    await store.put("old", b"1")
    await store.put("new", b"2")
    (tmp_path / "payloads" / ".hidden").write_bytes(b"not a key")
    hour_ago = time.time() - 3600
    os.utime(tmp_path / "payloads" / "old", (hour_ago, hour_ago))
    os.utime(tmp_path / "payloads" / ".hidden", (hour_ago, hour_ago))
    assert await store.sweep(older_than_s=600) == 1
    assert not await store.exists("old") and await store.exists("new")
    assert (tmp_path / "payloads" / ".hidden").exists()
    assert await PayloadStore(str(tmp_path / "nothing-yet")).sweep(older_than_s=1) == 0  # no directory: nothing
