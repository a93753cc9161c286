"""The ConfigStore over fsspec: a local directory (plain path or `file://`), `s3://bucket/prefix`,
`gs://bucket/prefix` (seed 000 §9) or Azure Blob / ADLS Gen2 `abfs://container/prefix` (also `abfss://`, `az://`),
and `open_config_store`, which picks it or the memory store.

Local writes are atomic (a temp file in the destination's directory, fsync, `os.replace`), so a reader or
a crash never sees an empty or half-written epoch; object stores replace a whole object in one PUT.
s3fs, gcsfs and adlfs are loaded by fsspec's protocol resolution, never imported here; credentials and endpoints
arrive as `storage_options` when a caller passes them, else from the backend's usual environment (AWS_*,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_CONNECTION_STRING, ...). Every failure of fsspec or a backend
(botocore, aiohttp, gcsfs, azure-storage-blob) leaves this module as ConfigStoreError, chained to the original.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from sie.stores.config_store import (
    MODEL_SUFFIX,
    ConfigStore,
    ConfigStoreError,
    CorruptEpochError,
    MemoryConfigStore,
    ModelIdNotStorableError,
    legacy_file_name,
    model_file_name,
    model_id_from_file,
)

logger = logging.getLogger(__name__)

SUPPORTED_PROTOCOLS = frozenset({"file", "local", "s3", "gs", "gcs", "abfs", "abfss", "az"})
EPOCH_FILE = "epoch"
MODELS_DIR = "models"
_EPOCH_TEXT = re.compile(r"[0-9]+")


def open_config_store(url: str | None, storage_options: dict[str, Any] | None = None) -> ConfigStore:
    """The store at `url`; None means no persistence (MemoryConfigStore, the seed's ephemeral default)."""
    if url is None:
        return MemoryConfigStore()
    return FsspecConfigStore(url, storage_options)


class FsspecConfigStore:
    """`{base}/epoch` and `{base}/models/{model_file_name(id)}` on any supported fsspec filesystem."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        protocol = fsspec.core.split_protocol(url)[0] or "file"
        if not url or protocol not in SUPPORTED_PROTOCOLS:
            allowed = ", ".join(sorted(SUPPORTED_PROTOCOLS))
            raise ConfigStoreError(f"config store URL {url!r} is not a local path or one of {allowed}://")
        with _translated("opening the config store at", url):
            self._fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.url = url
        self._root = root.rstrip("/") or root
        self._local = isinstance(self._fs, LocalFileSystem)
        self._scheme = "" if self._local else f"{protocol}://"
        if self._local:
            _remove_stale_temp_files(Path(self._root))

    def __repr__(self) -> str:
        return f"FsspecConfigStore({self.url!r})"

    def read_epoch(self) -> int:
        path = self._path(EPOCH_FILE)
        data = self._read(path)
        if data is None:
            return 0
        try:
            text = data.decode("ascii").strip()
        except UnicodeDecodeError:
            text = ""
        if not _EPOCH_TEXT.fullmatch(text):
            raise CorruptEpochError(f"epoch file {self._display(path)} holds {data[:40]!r}, not a non-negative integer")
        return int(text)

    def write_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"an epoch is a non-negative int, not {epoch!r}")
        self._write(self._path(EPOCH_FILE), f"{epoch}\n".encode())

    def list_models(self) -> dict[str, str]:
        directory = self._path(MODELS_DIR)
        with _translated("listing", self._display(directory)):
            paths = self._model_paths(directory)
            contents = self._fs.cat(paths, on_error="return") if paths else {}
        models: dict[str, str] = {}
        for path in paths:
            data = contents.get(path, FileNotFoundError(path))
            if isinstance(data, FileNotFoundError):
                continue  # deleted between the listing and the read
            if isinstance(data, BaseException):
                raise ConfigStoreError(f"reading {self._display(path)} failed: {data}") from data
            name = path.rsplit("/", 1)[-1]
            model_id = model_id_from_file(name)
            if model_id not in models or _is_current_name(name, model_id):
                models[model_id] = self._decode(path, data)  # a current name wins over a pre-escaping one
        return models

    def write_model(self, model_id: str, yaml_text: str) -> None:
        self._write(self._path(MODELS_DIR, model_file_name(model_id)), yaml_text.encode("utf-8"))

    def delete_model(self, model_id: str) -> bool:
        names = [model_file_name(model_id), legacy_file_name(model_id)]
        deleted = [self._delete(self._path(MODELS_DIR, name)) for name in names if name is not None]
        return any(deleted)

    def _delete(self, path: str) -> bool:
        with _translated("deleting", self._display(path)):
            self._fs.invalidate_cache(path)
            if not self._fs.exists(path):
                return False  # S3 deletes a missing key without complaint, so ask first
            try:
                self._fs.rm_file(path)
            except FileNotFoundError:
                return False
        return True

    def _path(self, *parts: str) -> str:
        return "/".join((self._root, *parts))

    def _display(self, path: str) -> str:
        return self._scheme + path

    def _model_paths(self, directory: str) -> list[str]:
        self._fs.invalidate_cache(directory)  # adlfs ignores `refresh` and keeps listing what it listed before
        try:
            names = self._fs.ls(directory, detail=False, refresh=True)
        except FileNotFoundError:
            return []  # no model was ever written
        return sorted(name for name in names if name.rsplit("/", 1)[-1].endswith(MODEL_SUFFIX))

    def _read(self, path: str) -> bytes | None:
        with _translated("reading", self._display(path)):
            self._fs.invalidate_cache(path)
            try:
                return self._fs.cat_file(path)
            except FileNotFoundError:
                return None

    def _write(self, path: str, data: bytes) -> None:
        with _translated("writing", self._display(path)):
            if self._local:
                _replace_atomically(Path(path), data)
            else:
                self._fs.pipe_file(path, data)  # one PUT: the object is replaced whole
            self._fs.invalidate_cache(path)

    def _decode(self, path: str, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigStoreError(f"{self._display(path)} is not UTF-8 text: {exc}") from exc


def _is_current_name(name: str, model_id: str) -> bool:
    try:
        return model_file_name(model_id) == name
    except ModelIdNotStorableError:
        return False  # an old file whose id no longer fits a file name once escaped


# A local write's temp file (`_replace_atomically`); one this old was left by a writer that died mid-write.
TEMP_PREFIX, TEMP_SUFFIX = ".sie-", ".tmp"
STALE_TEMP_S = 600.0


def _remove_stale_temp_files(root: Path) -> None:
    """Delete the temp files of writes that never finished (their process was killed between write and rename),
    left in the store's directories; recent ones may be a live writer's and stay."""
    if not root.is_dir():
        return
    cutoff = time.time() - STALE_TEMP_S
    for temp in root.rglob(f"{TEMP_PREFIX}*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove: the next start tries again
            if temp.is_file() and not temp.is_symlink() and temp.stat().st_mtime < cutoff:
                temp.unlink()
                logger.info("removed %s, left by a config store write that did not finish", temp)


def _replace_atomically(destination: Path, data: bytes) -> None:
    """Temp file in the same directory, write, flush + fsync, `os.replace`: never an empty destination."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    # A short temp name: the destination's own may already be as long as a file name can be.
    descriptor, temp_name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=destination.parent)
    try:
        with os.fdopen(descriptor, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.replace(temp_name, destination)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(destination.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); platforms that cannot open a directory skip it."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def _translated(action: str, where: str) -> Iterator[None]:
    """Re-raise anything fsspec or a backend throws as ConfigStoreError naming the path."""
    try:
        yield
    except ConfigStoreError:
        raise
    except Exception as exc:
        # Backends raise their own types (botocore, aiohttp, gcsfs HttpError, azure-core) from packages that fsspec
        # loads by protocol and this module never imports; OSError and ValueError come from fsspec itself.
        raise ConfigStoreError(f"{action} {where} failed: {type(exc).__name__}: {exc}") from exc
