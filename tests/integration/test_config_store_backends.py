"""The ConfigStore contract, one suite over every implementation: memory, a local directory, S3 (a real
SeaweedFS), GCS (a real fake-gcs-server) and Azure Blob (a real Azurite). Each test gets its own prefix on the
session's servers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest

from sie.stores.config_store import (
    MAX_FILE_NAME_BYTES,
    ConfigStore,
    ConfigStoreError,
    CorruptEpochError,
    MemoryConfigStore,
    ModelIdNotStorableError,
)
from sie.stores.fsspec_store import FsspecConfigStore, open_config_store
from support.object_stores import BUCKET, AzuriteBlob, object_store

FSSPEC_BACKENDS = ["local", "s3", "gcs", "azure"]


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
    server = object_store(kind, request)
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


def test_ids_the_slash_to_double_underscore_naming_merged_are_kept_apart(store: ConfigStore) -> None:
    ids = ["coll-org_/model", "coll-org/_model", "coll-org__model", "coll-org/model", "a_/_b", "a/__/b", "x~2F"]
    for model_id in ids:
        store.write_model(model_id, f"sie_id: {model_id}\n")
    assert store.list_models() == {model_id: f"sie_id: {model_id}\n" for model_id in ids}
    assert store.delete_model("coll-org_/model") is True
    assert sorted(store.list_models()) == sorted(ids[1:])


def test_the_longest_storable_id_round_trips_and_a_longer_one_is_refused(store: ConfigStore) -> None:
    longest = "org/" + "m" * (MAX_FILE_NAME_BYTES - len(".yaml") - len("org__"))
    store.write_model(longest, "a: 1\n")
    assert store.list_models() == {longest: "a: 1\n"}
    for too_long in (longest + "m", "org/" + "_" * 90):  # the second is short, but 3 bytes a character escaped
        with pytest.raises(ModelIdNotStorableError, match="255 bytes a file name may have"):
            store.write_model(too_long, "a: 1\n")
    assert list(store.list_models()) == [longest]


def test_files_named_before_escaping_still_read_and_delete(base: Base) -> None:
    base.put_raw("models/coll-org___model.yaml", b"old: 1\n")  # the old naming of `coll-org/_model`
    base.put_raw("models/BAAI__bge-m3.yaml", b"plain: 1\n")
    store = base.store()
    assert store.list_models() == {"coll-org/_model": "old: 1\n", "BAAI/bge-m3": "plain: 1\n"}
    store.write_model("coll-org/_model", "new: 2\n")
    assert store.list_models()["coll-org/_model"] == "new: 2\n"  # the current name wins
    assert store.delete_model("coll-org/_model") is True
    assert store.list_models() == {"BAAI/bge-m3": "plain: 1\n"}  # both names are gone
    assert store.delete_model("coll-org_/model") is False  # the old file never stood for this id


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


def test_an_abfs_store_opened_without_options_reads_the_azure_sdks_environment(
    azurite: AzuriteBlob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config role passes no storage_options: adlfs finds the account in AZURE_STORAGE_CONNECTION_STRING."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    prefix = uuid.uuid4().hex
    for url in (azurite.url(prefix), f"az://{BUCKET}/{prefix}"):
        store = open_config_store(url)
        store.write_model("BAAI/bge-m3", f"url: {url}\n")
        assert store.list_models() == {"BAAI/bge-m3": f"url: {url}\n"}
