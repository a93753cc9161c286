"""The ConfigStore contract, one suite over every implementation: memory, a local directory, S3 (a real
SeaweedFS) and GCS (a real fake-gcs-server). Each test gets its own prefix on the session's servers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest

from sie.stores.config_store import ConfigStore, ConfigStoreError, CorruptEpochError, MemoryConfigStore
from sie.stores.fsspec_store import FsspecConfigStore
from support.object_stores import FakeGcs, SeaweedS3, fake_gcs_fixture, seaweed_s3_fixture

__all__ = ["fake_gcs_fixture", "seaweed_s3_fixture"]

FSSPEC_BACKENDS = ["local", "s3", "gcs"]


@dataclass
class Base:
    """A fresh, empty store base on one backend, plus raw access to plant files behind the store's back."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def store(self) -> FsspecConfigStore:
        return FsspecConfigStore(self.url, self.storage_options)

    def put_raw(self, relative: str, data: bytes) -> None:
        filesystem, root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **self.storage_options)
        path = f"{root}/{relative}"
        if self.url.startswith("/"):
            filesystem.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        filesystem.pipe_file(path, data)


def _new_base(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Base:
    if kind == "local":
        return Base(str(tmp_path / "store"))
    server: SeaweedS3 | FakeGcs = request.getfixturevalue("seaweed_s3" if kind == "s3" else "fake_gcs")
    return Base(server.url(uuid.uuid4().hex), server.storage_options)


@pytest.fixture(name="base", params=FSSPEC_BACKENDS)
def base_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Base:
    return _new_base(request.param, request, tmp_path)


@pytest.fixture(name="store", params=["memory", *FSSPEC_BACKENDS])
def store_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> ConfigStore:
    if request.param == "memory":
        return MemoryConfigStore()
    return _new_base(request.param, request, tmp_path).store()


def test_epoch_is_zero_when_never_written(store: ConfigStore) -> None:
    assert store.read_epoch() == 0


def test_epoch_round_trips_and_is_replaced(store: ConfigStore) -> None:
    store.write_epoch(7)
    assert store.read_epoch() == 7
    store.write_epoch(8)
    assert store.read_epoch() == 8


def test_listing_an_empty_store_is_empty(store: ConfigStore) -> None:
    assert store.list_models() == {}


def test_models_round_trip_with_slashed_ids(store: ConfigStore) -> None:
    store.write_model("BAAI/bge-m3", "sie_id: BAAI/bge-m3\n")
    store.write_model("org/team/model-x", "sie_id: org/team/model-x\nnote: ü\n")
    store.write_model("plain", "sie_id: plain\n")
    store.write_model("BAAI/bge-m3", "sie_id: BAAI/bge-m3\nprofiles: {}\n")
    assert store.list_models() == {
        "BAAI/bge-m3": "sie_id: BAAI/bge-m3\nprofiles: {}\n",
        "org/team/model-x": "sie_id: org/team/model-x\nnote: ü\n",
        "plain": "sie_id: plain\n",
    }


def test_delete_reports_whether_the_model_was_stored(store: ConfigStore) -> None:
    store.write_model("BAAI/bge-m3", "a: 1\n")
    store.write_model("other/model", "b: 2\n")
    assert store.delete_model("BAAI/bge-m3") is True
    assert store.delete_model("BAAI/bge-m3") is False
    assert store.delete_model("never/stored") is False
    assert store.list_models() == {"other/model": "b: 2\n"}


def test_ids_with_double_underscore_are_refused(store: ConfigStore) -> None:
    with pytest.raises(ConfigStoreError, match="__"):
        store.write_model("bad__id", "a: 1\n")
    assert store.list_models() == {}


@pytest.mark.parametrize("content", [b"", b"abc", b"  \n", b"-1", b"12abc"])
def test_corrupt_epoch_raises_naming_the_path(base: Base, content: bytes) -> None:
    base.put_raw("epoch", content)
    with pytest.raises(CorruptEpochError, match=r"epoch file .*/epoch"):
        base.store().read_epoch()


def test_epoch_with_surrounding_whitespace_reads(base: Base) -> None:
    base.put_raw("epoch", b" 42\n")
    assert base.store().read_epoch() == 42


def test_a_second_store_sees_the_first_ones_writes(base: Base) -> None:
    first, second = base.store(), base.store()
    assert second.list_models() == {}
    assert second.read_epoch() == 0
    first.write_model("a/b", "x: 1\n")
    first.write_epoch(3)
    assert second.list_models() == {"a/b": "x: 1\n"}
    assert second.read_epoch() == 3
    assert first.delete_model("a/b") is True
    assert second.list_models() == {}
    assert second.delete_model("a/b") is False


def test_listing_skips_files_that_are_not_model_yamls(base: Base) -> None:
    base.put_raw("models/a__b.yaml", b"x: 1\n")
    base.put_raw("models/README.txt", b"not a model")
    assert base.store().list_models() == {"a/b": "x: 1\n"}


def test_a_model_file_that_is_not_utf8_is_an_error(base: Base) -> None:
    base.put_raw("models/a__b.yaml", b"\xff\xfe")
    with pytest.raises(ConfigStoreError, match=r"a__b\.yaml"):
        base.store().list_models()
