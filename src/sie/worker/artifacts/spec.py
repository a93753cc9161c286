"""Where a model's files come from: the sources of one model or profile, in DESIGN §6 order, and the
content-hash cache key of each source's identity. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from sie.catalog.errors import ConfigError
from sie.catalog.model import DEFAULT_PROFILE, ModelConfig, PackageSource

KEY_HEX_CHARS = 24
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@attrs.frozen
class LocalDir:
    """A `weights_path` without a URL scheme: used in place, never copied."""

    path: Path


@attrs.frozen
class RemoteDir:
    """A `weights_path` fsspec URL (`s3://`, `gs://`, `file://`, `memory://`, ...): copied into the cache."""

    url: str


@attrs.frozen
class HubRepo:
    """A Hugging Face Hub repository at a revision (None: the default branch)."""

    repo_id: str
    revision: str | None = None


Source = LocalDir | RemoteDir | PackageSource | HubRepo


@attrs.frozen
class ArtifactSpec:
    """The sources of one artifact (a model directory or a tokenizer), with the model named for errors."""

    model: str
    weights_path: str | None = None
    package: PackageSource | None = None
    hf_id: str | None = None
    hf_revision: str | None = None

    def sources(self) -> list[Source]:
        """Configured sources, in the order they are tried: weights_path, package, hf_id."""
        found: list[Source] = []
        if self.weights_path:
            found.append(_weights_source(self.weights_path))
        if self.package is not None:
            found.append(self.package)
        if self.hf_id:
            found.append(HubRepo(self.hf_id, self.hf_revision))
        return found


def _weights_source(weights_path: str) -> LocalDir | RemoteDir:
    if "://" in weights_path:
        return RemoteDir(weights_path)
    return LocalDir(Path(weights_path).expanduser())


def canonical_distribution(name: str) -> str:
    """PEP 503 normalisation: `Vital_Model.ONNX` and `vital-model-onnx` name one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def describe(source: Source) -> str:
    """One human-readable phrase for error messages and progress displays."""
    if isinstance(source, LocalDir):
        return f"weights_path {source.path}"
    if isinstance(source, RemoteDir):
        return f"weights_path {source.url}"
    if isinstance(source, PackageSource):
        return f"package {source.distribution}=={source.version} ({source.path})"
    return f"hf_id {source.repo_id}@{source.revision or 'main'}"


def source_identity(source: Source) -> dict[str, str]:
    """The fields that decide which files a source yields; the cache key hashes exactly these."""
    if isinstance(source, LocalDir):
        return {"kind": "local", "path": str(source.path)}
    if isinstance(source, RemoteDir):
        return {"kind": "url", "url": source.url.rstrip("/")}
    if isinstance(source, PackageSource):
        return {
            "kind": "package",
            "distribution": canonical_distribution(source.distribution),
            "version": source.version.strip(),
            "path": source.path.strip("/"),
        }
    return {"kind": "hub", "repo_id": source.repo_id, "revision": source.revision or "main"}


def cache_key(source: Source) -> str:
    """SHA-256 of the canonical JSON of the source identity."""
    canonical = json.dumps(source_identity(source), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def entry_name(source: Source) -> str:
    """The cache directory name: a readable label plus the first 24 hex characters of the key."""
    identity = source_identity(source)
    if isinstance(source, PackageSource):
        label = f"{identity['distribution']}-{identity['version']}"
    else:
        label = identity["kind"]
    return f"{_LABEL_UNSAFE.sub('_', label)}-{cache_key(source)[:KEY_HEX_CHARS]}"


@attrs.frozen
class ProfileArtifacts:
    """What one profile loads: the model files, an optional separate tokenizer, the ONNX file name, and a head trained
    apart from the model with the name of its file (`HEAD_PATH_OPTION`)."""

    model: ArtifactSpec
    tokenizer: ArtifactSpec | None = None
    onnx_file: str | None = None
    head: ArtifactSpec | None = None
    head_file: str | None = None


# A head trained apart from its model, in a repository (or a local directory or file) of its own, that a recipe reads
# beside the model: stablebridge's pruning head (`pruning_head_path`, `pruning_head_file`, default `best.pt`).
HEAD_PATH_OPTION: Final = "pruning_head_path"
HEAD_FILE_OPTION: Final = "pruning_head_file"
DEFAULT_HEAD_FILE: Final = "best.pt"


def profile_artifacts(config: ModelConfig, profile: str = DEFAULT_PROFILE) -> ProfileArtifacts:
    """Sources for one profile: `adapter_options.loadtime.package` replaces the model's own sources
    (a profile such as `int8` ships other files than the hub repo), `tokenizer_package` adds a tokenizer.
    """
    loadtime = config.resolve_profile(profile).loadtime_options
    field = f"profiles.{profile}.adapter_options.loadtime"
    override = loadtime.get("package")
    if override is not None:
        model = ArtifactSpec(config.sie_id, package=_package(config, f"{field}.package", override))
    else:
        model = ArtifactSpec(
            config.sie_id,
            weights_path=config.weights_path,
            package=config.package,
            hf_id=config.hf_id,
            hf_revision=config.hf_revision,
        )
    tokenizer = None
    if loadtime.get("tokenizer_package") is not None:
        package = _package(config, f"{field}.tokenizer_package", loadtime["tokenizer_package"])
        tokenizer = ArtifactSpec(config.sie_id, package=package)
    onnx_file = loadtime.get("onnx_file")
    head, head_file = _head(config, loadtime)
    return ProfileArtifacts(model, tokenizer, str(onnx_file) if onnx_file else None, head, head_file)


def _head(config: ModelConfig, loadtime: Mapping[str, Any]) -> tuple[ArtifactSpec | None, str | None]:
    """Where a head trained apart from the model lives, as the public recipe looks for it: a local file, a local
    directory holding `HEAD_FILE_OPTION`, else a Hub repository holding it."""
    location = loadtime.get(HEAD_PATH_OPTION)
    if not location:
        return None, None
    location, name = str(location), str(loadtime.get(HEAD_FILE_OPTION) or DEFAULT_HEAD_FILE)
    local = Path(location)
    if local.is_file():
        return ArtifactSpec(config.sie_id, weights_path=str(local.parent)), local.name
    if local.is_dir():
        return ArtifactSpec(config.sie_id, weights_path=location), name
    return ArtifactSpec(config.sie_id, hf_id=location), name


def _package(config: ModelConfig, field: str, value: Any) -> PackageSource:
    if not isinstance(value, Mapping):
        message = "must be a mapping with distribution, version and path"
        raise ConfigError(message, model_id=config.sie_id, field=field)
    parts = {}
    for key in ("distribution", "version", "path"):
        item = value.get(key)
        if not isinstance(item, str) or not item.strip():
            message = "Missing required field: a non-empty string"
            raise ConfigError(message, model_id=config.sie_id, field=f"{field}.{key}")
        parts[key] = item.strip()
    return PackageSource(**parts)
