"""The payload store (seed 000 §16.2, seed 001 "Preparation And Framing"): where a gateway puts a work item's
payload that is too large to travel inline, and where a sidecar reads it back, over fsspec: a local directory
(plain path or `file://`), `s3://bucket/prefix`, `gs://bucket/prefix` or Azure Blob / ADLS Gen2
`abfs://container/prefix` (also `abfss://`, `az://`).

Keys are plain names below the store's base, never paths: a key with a separator, a leading dot or a control
character is refused, so a work item cannot name a file outside the store; in a local store a key that is a
symbolic link is neither read nor written through (whoever can write the directory cannot point a read elsewhere).
Reads are bounded. fsspec is
synchronous here, so every call runs in a worker thread, never on the event loop. Every failure of fsspec or a
backend leaves this module as a PayloadStoreError, chained to the original:

    PayloadStoreError           the store cannot be reached or refused the operation
    ├── PayloadNotFoundError    no payload under that key (never written, or already deleted)
    ├── PayloadOverLimitError   the payload is larger than the reader allows
    └── InvalidPayloadKeyError  the key is not a plain name
"""

from __future__ import annotations

import asyncio
import datetime
import errno
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

SUPPORTED_PROTOCOLS: Final = frozenset({"file", "local", "s3", "gs", "gcs", "abfs", "abfss", "az"})
MAX_KEY_CHARS: Final = 512
# A plain name: no path separator, no control character, not starting with a dot (so never `.` or `..`).
_PLAIN_KEY: Final = re.compile(r"(?!\.)[^/\\\x00-\x1f\x7f]+")


class PayloadStoreError(Exception):
    """The payload store failed; the message names the key and the store."""


class PayloadNotFoundError(PayloadStoreError):
    """No payload is stored under the key."""


class PayloadOverLimitError(PayloadStoreError):
    """The stored payload is larger than the read allows."""


class InvalidPayloadKeyError(PayloadStoreError):
    """The key is not a plain name below the store's base."""


def check_key(key: str) -> str:
    """`key` when it is a plain name; InvalidPayloadKeyError otherwise."""
    if len(key) > MAX_KEY_CHARS or not _PLAIN_KEY.fullmatch(key):
        raise InvalidPayloadKeyError(f"payload key {key[:80]!r} is not a plain name")
    return key


def open_payload_store(url: str | None, storage_options: dict[str, Any] | None = None) -> PayloadStore | None:
    """The store at `url`; None (no offload) when no URL is set."""
    return PayloadStore(url, storage_options) if url else None


class PayloadStore:
    """Payloads as whole objects `{base}/{key}` on one fsspec filesystem; put, bounded get, delete."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        # Imported here: a gateway or sidecar without a payload store (SIE_PAYLOAD_STORE_URL unset) never loads fsspec.
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        protocol = fsspec.core.split_protocol(url)[0] or "file"
        if not url or protocol not in SUPPORTED_PROTOCOLS:
            allowed = ", ".join(sorted(SUPPORTED_PROTOCOLS))
            raise PayloadStoreError(f"payload store URL {url!r} is not a local path or one of {allowed}://")
        with _translated("opening the payload store at", url):
            self._fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.url = url
        self._root = root.rstrip("/") or root
        self._local = isinstance(self._fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"PayloadStore({self.url!r})"

    async def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing what was there."""
        await asyncio.to_thread(self._put, self._path(key), data)

    async def get(self, key: str, max_bytes: int) -> bytes:
        """The payload under `key`: PayloadNotFoundError when there is none, PayloadOverLimitError when it is
        larger than `max_bytes` (at most `max_bytes + 1` bytes are read to know)."""
        return await asyncio.to_thread(self._get, self._path(key), max_bytes)

    async def delete(self, key: str) -> None:
        """Remove the payload under `key`; a missing one is not an error (deletes are retried and raced)."""
        await asyncio.to_thread(self._delete, self._path(key))

    async def sweep(self, older_than_s: float, now: float | None = None) -> int:
        """Delete every payload last written more than `older_than_s` seconds before `now` (default: the clock) —
        the keys of a gateway that crashed before its requests ended, which nobody else deletes; how many were."""
        return await asyncio.to_thread(self._sweep, older_than_s, time.time() if now is None else now)

    async def exists(self, key: str) -> bool:
        """Whether a payload is stored under `key` (for checks that nothing is left behind)."""
        return await asyncio.to_thread(self._exists, self._path(key))

    def _path(self, key: str) -> str:
        return f"{self._root}/{check_key(key)}"

    def _put(self, path: str, data: bytes) -> None:
        with _translated("writing", self._display(path)):
            if self._local:
                self._fs.makedirs(self._root, exist_ok=True)
                with _no_link(path), os.fdopen(os.open(path, _WRITE_FLAGS, 0o600), "wb") as handle:
                    handle.write(data)
                return
            self._fs.pipe_file(path, data)  # one PUT on object stores: the object is replaced whole

    def _get(self, path: str, max_bytes: int) -> bytes:
        with _translated("reading", self._display(path)):
            try:
                if self._local:
                    with _no_link(path), os.fdopen(os.open(path, _READ_FLAGS), "rb") as handle:
                        data = handle.read(max_bytes + 1)
                else:
                    data = self._fs.cat_file(path, start=0, end=max_bytes + 1)
            except FileNotFoundError as exc:
                raise PayloadNotFoundError(f"no payload at {self._display(path)}") from exc
        if len(data) > max_bytes:
            raise PayloadOverLimitError(f"the payload at {self._display(path)} is over {max_bytes} bytes")
        return data

    def _delete(self, path: str) -> None:
        with _translated("deleting", self._display(path)):
            try:
                self._fs.rm_file(path)
            except FileNotFoundError:
                return
            self._fs.invalidate_cache(path)

    def _sweep(self, older_than_s: float, now: float) -> int:
        with _translated("listing", self._display(self._root)):
            self._fs.invalidate_cache(self._root)
            try:
                entries = self._fs.ls(self._root, detail=True)
            except FileNotFoundError:
                return 0
        swept = 0
        for entry in entries:
            name = str(entry.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") != "file" or not _PLAIN_KEY.fullmatch(name):
                continue
            written = _modified_s(entry)
            if written is not None and written <= now - older_than_s:
                self._delete(f"{self._root}/{name}")
                swept += 1
        return swept

    def _exists(self, path: str) -> bool:
        with _translated("looking up", self._display(path)):
            self._fs.invalidate_cache(path)
            return bool(self._fs.exists(path))

    def _display(self, path: str) -> str:
        return path if self._local else f"{self.url.split('://', 1)[0]}://{path}"


def _modified_s(entry: dict[str, Any]) -> float | None:
    """When a listed object was last written, as unix seconds, from whichever field its backend fills: a local
    file's `mtime`, S3's `LastModified`, GCS's `updated`, Azure's `last_modified` (adlfs: an aware datetime);
    None when none says."""
    for field in ("mtime", "LastModified", "updated", "last_modified"):
        value = entry.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, datetime.datetime):
            return value.timestamp() if value.tzinfo else value.replace(tzinfo=datetime.UTC).timestamp()
        if isinstance(value, str):
            try:
                parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return parsed.timestamp() if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC).timestamp()
    return None


# A local store's files are opened without following a symbolic link at the key (ELOOP instead).
_READ_FLAGS: Final = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)


@contextmanager
def _no_link(path: str) -> Iterator[None]:
    """A PayloadStoreError naming `path` for the ELOOP an O_NOFOLLOW open meets at a symbolic link."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PayloadStoreError(f"{path} is a symbolic link: a local payload store does not follow one") from exc
        raise


@contextmanager
def _translated(action: str, where: str) -> Iterator[None]:
    """Re-raise anything fsspec or a backend throws as PayloadStoreError naming the path."""
    try:
        yield
    except PayloadStoreError:
        raise
    except Exception as exc:
        # Backends raise their own types (botocore, aiohttp, gcsfs HttpError, azure-core) from packages that fsspec
        # loads by protocol and this module never imports; OSError and ValueError come from fsspec itself.
        raise PayloadStoreError(f"{action} {where} failed: {type(exc).__name__}: {exc}") from exc
