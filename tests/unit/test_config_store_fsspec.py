"""FsspecConfigStore on a local directory: atomic replacement under a concurrent reader, URL forms, the
`open_config_store` factory, and failures surfacing as ConfigStoreError. The cross-backend contract is in
tests/integration/test_config_store_backends.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sie.stores.config_store import ConfigStoreError, MemoryConfigStore
from sie.stores.fsspec_store import FsspecConfigStore, open_config_store

REWRITES = 50


def test_local_writes_never_leave_the_destination_empty_or_partial(tmp_path: Path) -> None:
    store = FsspecConfigStore(str(tmp_path))
    body = "sie_id: a/b\n" + "x" * 256_000 + "\n"
    variants = [body.replace("x", letter) for letter in "xyz"]
    store.write_model("a/b", variants[0])
    store.write_epoch(1)
    destination, epoch_file = tmp_path / "models" / "a__b.yaml", tmp_path / "epoch"
    done = threading.Event()
    seen: list[str] = []
    epochs: list[str] = []

    def read_continuously() -> None:
        while not done.is_set():
            seen.append(destination.read_text())
            epochs.append(epoch_file.read_text())

    reader = threading.Thread(target=read_continuously)
    reader.start()
    try:
        for index in range(REWRITES):
            store.write_model("a/b", variants[index % 3])
            store.write_epoch(index + 2)
    finally:
        done.set()
        reader.join(timeout=10)
    assert seen, "the reader never ran"
    assert all(text in variants for text in seen), "a reader saw an empty or partial model file"
    assert all(text.strip().isdigit() for text in epochs), "a reader saw an empty or partial epoch file"
    assert store.read_epoch() == REWRITES + 1
    assert [path.name for path in (tmp_path / "models").iterdir()] == ["a__b.yaml"], "a temp file was left behind"


def test_file_url_and_plain_path_name_the_same_store(tmp_path: Path) -> None:
    FsspecConfigStore(f"file://{tmp_path}").write_model("a/b", "x: 1\n")
    FsspecConfigStore(str(tmp_path)).write_epoch(5)
    assert (tmp_path / "models" / "a__b.yaml").read_text() == "x: 1\n"
    assert (tmp_path / "epoch").read_text().strip() == "5"
    assert FsspecConfigStore(f"file://{tmp_path}").read_epoch() == 5


def test_a_missing_base_directory_is_an_empty_store_created_on_first_write(tmp_path: Path) -> None:
    store = FsspecConfigStore(str(tmp_path / "not" / "yet"))
    assert (store.read_epoch(), store.list_models()) == (0, {})
    store.write_epoch(1)
    assert (tmp_path / "not" / "yet" / "epoch").exists()


def test_corrupt_epoch_message_names_the_local_path(tmp_path: Path) -> None:
    (tmp_path / "epoch").write_text("")
    with pytest.raises(ConfigStoreError, match=str(tmp_path / "epoch")):
        FsspecConfigStore(str(tmp_path)).read_epoch()


@pytest.mark.parametrize("epoch", [-1, True, 1.5])
def test_only_non_negative_int_epochs_are_written(tmp_path: Path, epoch: object) -> None:
    with pytest.raises(ValueError, match="non-negative int"):
        FsspecConfigStore(str(tmp_path)).write_epoch(epoch)  # type: ignore[arg-type]


def test_io_failures_become_config_store_errors_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the base directory should be")
    store = FsspecConfigStore(str(blocker))
    with pytest.raises(ConfigStoreError, match=f"writing {blocker}/epoch failed") as caught:
        store.write_epoch(1)
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(ConfigStoreError, match=f"{blocker}/epoch"):
        store.read_epoch()


@pytest.mark.parametrize("url", ["oss://bucket/prefix", "memory://x", "http://example.invalid/x", ""])
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigStoreError, match="not a local path"):
        FsspecConfigStore(url)


def test_open_config_store_picks_memory_or_fsspec(tmp_path: Path) -> None:
    assert isinstance(open_config_store(None), MemoryConfigStore)
    store = open_config_store(str(tmp_path))
    assert isinstance(store, FsspecConfigStore)
    assert repr(store) == f"FsspecConfigStore({str(tmp_path)!r})"


def test_opening_a_local_store_removes_the_temp_files_of_writes_that_died(tmp_path: Path) -> None:
    """A write killed between its temp file and the rename leaves `.sie-*.tmp` behind; the next open removes the
    stale ones (older than STALE_TEMP_S) and keeps a recent one, which may be a live writer's."""
    import os
    import time

    from sie.stores.fsspec_store import STALE_TEMP_S

    store = FsspecConfigStore(str(tmp_path))
    store.write_model("acme/m", "sie_id: acme/m\n")
    models = next(path for path in tmp_path.rglob("*") if path.is_dir())
    stale, fresh = models / ".sie-abc.tmp", tmp_path / ".sie-def.tmp"
    stale.write_text("half a write")
    fresh.write_text("being written")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(stale, (old, old))
    FsspecConfigStore(str(tmp_path))
    assert not stale.exists() and fresh.exists()
    assert FsspecConfigStore(str(tmp_path)).list_models() == {"acme/m": "sie_id: acme/m\n"}
