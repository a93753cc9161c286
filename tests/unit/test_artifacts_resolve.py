"""Resolution through `weights_path`: local dirs used in place, fsspec URLs (the real `memory://` backend and
`file://`) copied into the cache with progress, source fallback and classified errors.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from sie.catalog.model import PackageSource
from sie.worker.artifacts import (
    STAGE_CACHED,
    STAGE_DOWNLOAD,
    STAGE_FILE,
    ArtifactError,
    ArtifactResolver,
    ArtifactSpec,
    ErrorClass,
    Pip,
    ProgressEvent,
    resolve_artifacts,
)
from sie.worker.artifacts import remote as remote_module

FILES = {"config.json": b'{"hidden_size": 8}', "tokenizer.json": b"{}", "onnx/model.onnx": b"\x01" * 3000}


@pytest.fixture
def memory_url() -> Iterator[str]:
    filesystem = fsspec.filesystem("memory")
    root = f"/models/{uuid.uuid4().hex}"
    filesystem.pipe({f"{root}/{name}": data for name, data in FILES.items()})
    yield f"memory://{root}"
    filesystem.rm(root, recursive=True)


def _tree(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def test_local_dir_is_used_in_place(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    found = resolve_artifacts(ArtifactSpec("m", weights_path=str(model_dir)), tmp_path / "cache")
    assert found == model_dir
    assert not (tmp_path / "cache" / "artifacts").exists()


def test_missing_local_dir_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as info:
        resolve_artifacts(ArtifactSpec("org/m", weights_path=str(tmp_path / "nope")), tmp_path / "cache")
    assert info.value.error_class is ErrorClass.NOT_FOUND
    assert info.value.model == "org/m"
    assert str(info.value).startswith("Model 'org/m': weights_path ")
    assert "is not a directory" in str(info.value)


def test_memory_url_is_copied_into_the_cache_with_progress(tmp_path: Path, memory_url: str) -> None:
    events: list[ProgressEvent] = []
    found = resolve_artifacts(ArtifactSpec("m", weights_path=memory_url), tmp_path, on_progress=events.append)
    assert found.is_relative_to(tmp_path / "artifacts")
    assert _tree(found) == FILES
    total = sum(len(data) for data in FILES.values())
    downloads = [event for event in events if event.stage == STAGE_DOWNLOAD]
    assert downloads[0] == ProgressEvent(STAGE_DOWNLOAD, f"weights_path {memory_url}", 0, total)
    assert downloads[-1] == ProgressEvent(STAGE_DOWNLOAD, f"weights_path {memory_url}", total, total)
    assert [event.done_bytes for event in downloads] == sorted(event.done_bytes for event in downloads)
    files = {event.path: event.done_bytes for event in events if event.stage == STAGE_FILE}
    assert files == {name: len(data) for name, data in FILES.items()}


def test_second_resolution_is_a_cache_hit(tmp_path: Path, memory_url: str, monkeypatch) -> None:
    copies: list[str] = []
    real_copy = remote_module.copy_url

    def counting_copy(url, destination, on_progress) -> None:
        copies.append(url)
        real_copy(url, destination, on_progress)

    monkeypatch.setattr("sie.worker.artifacts.resolve.copy_url", counting_copy)
    spec = ArtifactSpec("m", weights_path=memory_url)
    first = resolve_artifacts(spec, tmp_path)
    events: list[ProgressEvent] = []
    second = resolve_artifacts(spec, tmp_path, on_progress=events.append)
    assert first == second
    assert copies == [memory_url]
    total = sum(len(data) for data in FILES.values())
    assert events[0] == ProgressEvent(STAGE_CACHED, f"weights_path {memory_url}", total, total)
    assert [event.stage for event in events[1:]] == [STAGE_FILE] * len(FILES)


async def test_eight_concurrent_async_resolutions_copy_once(tmp_path: Path, memory_url: str, monkeypatch) -> None:
    copies: list[str] = []
    real_copy = remote_module.copy_url

    def counting_copy(url, destination, on_progress) -> None:
        copies.append(url)
        real_copy(url, destination, on_progress)

    monkeypatch.setattr("sie.worker.artifacts.resolve.copy_url", counting_copy)
    resolver = ArtifactResolver(tmp_path)
    spec = ArtifactSpec("m", weights_path=memory_url)

    found = await asyncio.gather(*(resolver.resolve_async(spec) for _ in range(8)))
    assert len(set(found)) == 1
    assert copies == [memory_url]


def test_single_file_url_keeps_its_name(tmp_path: Path, memory_url: str) -> None:
    found = resolve_artifacts(ArtifactSpec("m", weights_path=f"{memory_url}/onnx/model.onnx"), tmp_path)
    assert _tree(found) == {"model.onnx": FILES["onnx/model.onnx"]}


def test_file_url_is_copied(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "onnx").mkdir(parents=True)
    for name, data in FILES.items():
        (source / name).write_bytes(data)
    found = resolve_artifacts(ArtifactSpec("m", weights_path=source.as_uri()), tmp_path / "cache")
    assert found.is_relative_to(tmp_path / "cache")
    assert _tree(found) == FILES


@pytest.mark.parametrize(
    ("url", "error_class", "phrase"),
    [
        ("memory://models/does-not-exist", ErrorClass.NOT_FOUND, "does not exist"),
        ("nosuchproto://bucket/model", ErrorClass.NOT_FOUND, "not a usable fsspec URL"),
    ],
)
def test_bad_urls_are_classified(tmp_path: Path, url: str, error_class: ErrorClass, phrase: str) -> None:
    with pytest.raises(ArtifactError) as info:
        resolve_artifacts(ArtifactSpec("org/m", weights_path=url), tmp_path)
    assert info.value.error_class is error_class
    assert phrase in str(info.value)
    assert isinstance(info.value.__cause__, Exception)
    assert not (tmp_path / "artifacts").exists() or not any((tmp_path / "artifacts").iterdir())


def test_failed_copy_leaves_no_entry(tmp_path: Path, memory_url: str, monkeypatch) -> None:
    def failing_open(self, *args, **kwargs):
        raise ConnectionResetError("peer went away")

    monkeypatch.setattr(type(fsspec.filesystem("memory")), "open", failing_open)
    with pytest.raises(ArtifactError) as info:
        resolve_artifacts(ArtifactSpec("m", weights_path=memory_url), tmp_path)
    assert info.value.error_class is ErrorClass.NETWORK
    assert list((tmp_path / "artifacts").iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_no_source_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as info:
        resolve_artifacts(ArtifactSpec("org/m"), tmp_path)
    assert info.value.error_class is ErrorClass.NOT_FOUND
    assert "set weights_path, package or hf_id" in str(info.value)


def test_cached_reports_only_what_needs_no_fetch(tmp_path: Path, memory_url: str) -> None:
    resolver = ArtifactResolver(tmp_path)
    spec = ArtifactSpec("m", weights_path=memory_url)
    assert resolver.cached(spec) is None
    found = resolver.resolve(spec)
    assert resolver.cached(spec) == found
    assert resolver.cached(ArtifactSpec("m", weights_path=str(tmp_path))) == tmp_path


def test_every_failure_is_named_and_the_first_class_wins(tmp_path: Path) -> None:
    # pip that cannot be started: DEPENDENCY; an offline hub: NOT_FOUND; a missing dir: NOT_FOUND.
    resolver = ArtifactResolver(tmp_path, hf_offline=True, pip=Pip(command=(str(tmp_path / "no-python"),)))
    spec = ArtifactSpec(
        "org/m",
        weights_path=str(tmp_path / "missing"),
        package=PackageSource("fake-model", "1.0.0", "fake_model/model"),
        hf_id="org/m",
    )
    with pytest.raises(ArtifactError) as info:
        resolver.resolve(spec)
    message = str(info.value)
    assert info.value.error_class is ErrorClass.NOT_FOUND  # the first failure's class
    assert "weights_path" in message and "package fake-model==1.0.0" in message and "hf_id org/m" in message
    assert "cannot run pip" in message


def test_a_network_failure_sets_the_class(tmp_path: Path, memory_url: str, monkeypatch) -> None:
    def failing_open(self, *args, **kwargs):
        raise TimeoutError("read timed out")

    monkeypatch.setattr(type(fsspec.filesystem("memory")), "open", failing_open)
    spec = ArtifactSpec("org/m", weights_path=memory_url, hf_id="org/m")
    with pytest.raises(ArtifactError) as info:
        ArtifactResolver(tmp_path, hf_offline=True).resolve(spec)
    assert info.value.error_class is ErrorClass.NETWORK
    assert type(info.value) is ArtifactError
    assert "read timed out" in str(info.value) and "not available offline" in str(info.value)
