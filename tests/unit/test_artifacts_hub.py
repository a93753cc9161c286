"""Hub sources: offline mode fails fast with a classified, actionable error; a snapshot already in the
cache's hub/ directory still resolves offline; hub exceptions map onto the load-failure classes.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import errors as hub_errors

from sie.worker.artifacts import (
    STAGE_DOWNLOAD,
    STAGE_FILE,
    ArtifactError,
    ArtifactResolver,
    ArtifactSpec,
    ArtifactUnavailable,
    ErrorClass,
    ProgressEvent,
)
from sie.worker.artifacts.hub import HubOffline, _translate

REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"


def _seed_hub_cache(cache_dir: Path, repo_id: str) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = cache_dir / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"hidden_size": 384}')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def test_offline_hub_only_model_fails_fast_and_names_the_remedy(tmp_path: Path, monkeypatch) -> None:
    # huggingface_hub read its environment when sie.worker.artifacts imported it; setting the variable
    # now mirrors an offline deployment without switching the rest of this process to offline mode.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = ArtifactSpec("sentence-transformers/all-MiniLM-L6-v2", hf_id="sentence-transformers/all-MiniLM-L6-v2")
    started = time.monotonic()
    with pytest.raises(ArtifactUnavailable) as info:
        ArtifactResolver(tmp_path, hf_offline=True).resolve(spec)
    assert time.monotonic() - started < 5
    error = info.value
    assert error.error_class is ErrorClass.NOT_FOUND
    assert error.model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "not available offline" in str(error)
    assert "`package`" in str(error) and "`weights_path`" in str(error)
    assert isinstance(error.__cause__, HubOffline)
    assert isinstance(error.__cause__.__cause__, hub_errors.LocalEntryNotFoundError)


def test_cached_snapshot_resolves_offline(tmp_path: Path) -> None:
    snapshot = _seed_hub_cache(tmp_path, "acme/tiny")
    resolver = ArtifactResolver(tmp_path, hf_offline=True)
    events: list[ProgressEvent] = []
    spec = ArtifactSpec("acme/tiny", hf_id="acme/tiny", hf_revision=REVISION)
    found = resolver.resolve(spec, events.append)
    assert found == snapshot
    source = f"hf_id acme/tiny@{REVISION}"
    assert events[-2:] == [
        ProgressEvent(STAGE_DOWNLOAD, source, 20, 20),
        ProgressEvent(STAGE_FILE, source, 20, 20, "config.json"),
    ]
    assert resolver.resolve(ArtifactSpec("acme/tiny", hf_id="acme/tiny")) == snapshot


def test_hub_is_the_fallback_after_a_missing_weights_path(tmp_path: Path) -> None:
    snapshot = _seed_hub_cache(tmp_path, "acme/tiny")
    spec = ArtifactSpec("acme/tiny", weights_path=str(tmp_path / "gone"), hf_id="acme/tiny")
    assert ArtifactResolver(tmp_path, hf_offline=True).resolve(spec) == snapshot


def _response(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/models/x"))


@pytest.mark.parametrize(
    ("exc", "offline", "error_class"),
    [
        (hub_errors.LocalEntryNotFoundError("no cache"), True, ErrorClass.NOT_FOUND),
        (hub_errors.OfflineModeIsEnabled("offline"), False, ErrorClass.NOT_FOUND),
        (hub_errors.LocalEntryNotFoundError("connect failed, no cache"), False, ErrorClass.NETWORK),
        (hub_errors.GatedRepoError("gated", response=_response(403)), False, ErrorClass.GATED),
        (hub_errors.RepositoryNotFoundError("missing", response=_response(404)), False, ErrorClass.NOT_FOUND),
        (hub_errors.RevisionNotFoundError("bad rev", response=_response(404)), False, ErrorClass.NOT_FOUND),
        (hub_errors.HfHubHTTPError("busy", response=_response(503)), False, ErrorClass.NETWORK),
        (hub_errors.HfHubHTTPError("teapot", response=_response(418)), False, ErrorClass.UNKNOWN),
        (httpx2.ConnectError("refused"), False, ErrorClass.NETWORK),
        (TimeoutError("slow"), False, ErrorClass.NETWORK),
        (RuntimeError("surprise"), False, ErrorClass.UNKNOWN),
    ],
)
def test_hub_errors_are_classified(exc: Exception, offline: bool, error_class: ErrorClass) -> None:
    assert _translate(exc, offline).error_class is error_class


def test_connection_failure_without_offline_mode_is_network(tmp_path: Path, monkeypatch) -> None:
    def unreachable(*args, **kwargs):
        raise hub_errors.LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")

    monkeypatch.setattr("huggingface_hub.snapshot_download", unreachable)  # looked up when a hub fetch runs
    with pytest.raises(ArtifactError) as info:
        ArtifactResolver(tmp_path).resolve(ArtifactSpec("org/m", hf_id="org/m"))
    assert type(info.value) is ArtifactError
    assert info.value.error_class is ErrorClass.NETWORK
