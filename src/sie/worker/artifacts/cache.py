"""The model cache directory: committed entries (`files/` plus `manifest.json`) renamed into place in one
step, and per-entry locks (a thread lock inside the process, `fcntl.flock` across processes) so concurrent
resolutions of one source fetch once. It knows nothing about where the files come from.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

MANIFEST = "manifest.json"
FILES = "files"
MANIFEST_SCHEMA = 1

Fill = Callable[[Path], Mapping[str, Any]]
"""Writes an entry's files into the given empty directory; returns extra manifest fields."""

_registry_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}


def _thread_lock(lock_path: Path) -> threading.Lock:
    # flock excludes other processes; threads of this one wait here first, so one fd is enough.
    with _registry_guard:
        return _thread_locks.setdefault(str(lock_path), threading.Lock())


@contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


@attrs.frozen
class CacheEntry:
    """A committed entry: the directory holding the files, its manifest, and whether it was already there."""

    files: Path
    manifest: Mapping[str, Any]
    hit: bool


@attrs.frozen
class ArtifactCache:
    """One cache root (`SIE_MODEL_CACHE`) laid out as artifacts/, wheels/, hub/, locks/ and tmp/."""

    root: Path

    @property
    def entries_dir(self) -> Path:
        return self.root / "artifacts"

    @property
    def wheels_dir(self) -> Path:
        return self.root / "wheels"

    @property
    def hub_dir(self) -> Path:
        return self.root / "hub"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    @property
    def staging_dir(self) -> Path:
        return self.root / "tmp"

    def lookup(self, name: str) -> CacheEntry | None:
        """The committed entry `name`, or None when it is missing or its files no longer match the manifest."""
        entry = self.entries_dir / name
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        if not _files_intact(entry / FILES, manifest.get("files")):
            return None
        return CacheEntry(entry / FILES, manifest, hit=True)

    @contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Hold the lock of `name` against other threads and other processes sharing this cache root."""
        self.locks_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.locks_dir / f"{name}.lock"
        with _thread_lock(lock_path), _file_lock(lock_path):
            yield

    def get_or_fill(self, name: str, fill: Fill, identity: Mapping[str, Any]) -> CacheEntry:
        """The entry `name`, calling `fill` once (under the lock) when no intact entry exists."""
        found = self.lookup(name)
        if found is not None:
            return found
        with self.locked(name):
            found = self.lookup(name)
            if found is not None:
                return found
            return self._fill(name, fill, identity)

    def _fill(self, name: str, fill: Fill, identity: Mapping[str, Any]) -> CacheEntry:
        self._discard_leftovers(name)
        self.entries_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=self.staging_dir))
        try:
            files = staging / FILES
            files.mkdir()
            manifest = _manifest(name, identity, fill(files), files)
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
            # One rename publishes the entry: readers see all of it or none of it.
            staging.rename(self.entries_dir / name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return CacheEntry(self.entries_dir / name / FILES, manifest, hit=False)

    def _discard_leftovers(self, name: str) -> None:
        """Remove a broken entry and staging dirs of crashed fills; only called with the lock held."""
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        broken = self.entries_dir / name
        if broken.exists():
            # Move it out first so a half-deleted directory is never seen under its entry name.
            graveyard = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=self.staging_dir))
            broken.rename(graveyard / "broken")
        for leftover in self.staging_dir.glob(f"{name}.*"):
            shutil.rmtree(leftover, ignore_errors=True)


def _manifest(name: str, identity: Mapping[str, Any], extra: Mapping[str, Any], files: Path) -> dict[str, Any]:
    sizes = file_sizes(files)
    return {
        **extra,
        "schema": MANIFEST_SCHEMA,
        "name": name,
        "source": dict(identity),
        "files": sizes,
        "total_bytes": sum(sizes.values()),
        "created_at": time.time(),
    }


def file_sizes(root: Path) -> dict[str, int]:
    """Every file below `root` as a POSIX relative path mapped to its size in bytes."""
    return {
        path.relative_to(root).as_posix(): path.stat().st_size for path in sorted(root.rglob("*")) if path.is_file()
    }


def _files_intact(files: Path, expected: Any) -> bool:
    # A size check per file: cheap, and it catches files deleted or truncated after the commit.
    if not isinstance(expected, Mapping) or not files.is_dir():
        return False
    for relative, size in expected.items():
        try:
            if (files / relative).stat().st_size != size:
                return False
        except OSError:
            return False
    return True
