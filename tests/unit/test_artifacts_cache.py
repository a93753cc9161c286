"""The model cache: atomic commit, no half entries after a failed or crashed fill, self-repair of damaged
entries, and one fill for concurrent callers (threads and processes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sie.worker.artifacts import ArtifactCache
from sie.worker.artifacts.cache import FILES, MANIFEST

IDENTITY = {"kind": "test", "name": "m"}


def _writer(counter: list[int], delay: float = 0.0):
    def fill(files: Path) -> dict:
        counter.append(1)
        time.sleep(delay)  # widen the race window; not a wait for a condition
        (files / "config.json").write_text('{"hidden_size": 8}')
        (files / "sub").mkdir()
        (files / "sub" / "weights.bin").write_bytes(b"\x00" * 100)
        return {"origin": "test"}

    return fill


def test_fill_commits_files_and_manifest(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    calls: list[int] = []
    entry = cache.get_or_fill("m-1", _writer(calls), IDENTITY)
    assert not entry.hit
    assert entry.files == tmp_path / "artifacts" / "m-1" / FILES
    assert (entry.files / "sub" / "weights.bin").stat().st_size == 100
    manifest = json.loads((entry.files.parent / MANIFEST).read_text())
    assert manifest["files"] == {"config.json": 18, "sub/weights.bin": 100}
    assert manifest["total_bytes"] == 118
    assert manifest["source"] == IDENTITY
    assert manifest["origin"] == "test"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_second_call_is_a_hit_without_fill(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    calls: list[int] = []
    first = cache.get_or_fill("m-1", _writer(calls), IDENTITY)
    second = cache.get_or_fill("m-1", _writer(calls), IDENTITY)
    assert second.hit
    assert second.files == first.files
    assert calls == [1]


def test_failed_fill_leaves_no_entry_and_no_staging(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)

    def broken(files: Path) -> dict:
        (files / "partial.bin").write_bytes(b"half")
        raise RuntimeError("download cut")

    with pytest.raises(RuntimeError, match="download cut"):
        cache.get_or_fill("m-1", broken, IDENTITY)
    assert cache.lookup("m-1") is None
    assert not (tmp_path / "artifacts" / "m-1").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_leftovers_of_a_crashed_fill_are_removed(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    crashed = tmp_path / "tmp" / "m-1.abc123" / FILES
    crashed.mkdir(parents=True)
    (crashed / "partial.bin").write_bytes(b"half")
    other = tmp_path / "tmp" / "other-2.xyz"
    other.mkdir()
    entry = cache.get_or_fill("m-1", _writer([]), IDENTITY)
    assert entry.files.is_dir()
    assert not crashed.parent.exists()
    assert other.exists()  # another entry's staging dir belongs to its own lock holder


def test_entry_without_manifest_is_not_an_entry(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    (tmp_path / "artifacts" / "m-1" / FILES).mkdir(parents=True)
    assert cache.lookup("m-1") is None
    calls: list[int] = []
    assert not cache.get_or_fill("m-1", _writer(calls), IDENTITY).hit
    assert calls == [1]


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_damaged_entry_is_fetched_again(tmp_path: Path, damage: str) -> None:
    cache = ArtifactCache(tmp_path)
    calls: list[int] = []
    entry = cache.get_or_fill("m-1", _writer(calls), IDENTITY)
    weights = entry.files / "sub" / "weights.bin"
    if damage == "delete":
        weights.unlink()
    else:
        weights.write_bytes(b"\x00" * 10)
    assert cache.lookup("m-1") is None
    again = cache.get_or_fill("m-1", _writer(calls), IDENTITY)
    assert not again.hit
    assert weights.stat().st_size == 100
    assert calls == [1, 1]


def test_eight_threads_fill_once(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    calls: list[int] = []
    results: list[Path] = []
    barrier = threading.Barrier(8)

    def resolve() -> None:
        barrier.wait()
        results.append(cache.get_or_fill("m-1", _writer(calls, delay=0.2), IDENTITY).files)

    threads = [threading.Thread(target=resolve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]
    assert len(results) == 8 and len(set(results)) == 1


def test_different_entries_fill_in_parallel(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path)
    started = threading.Barrier(2, timeout=5)

    def fill(files: Path) -> dict:
        started.wait()  # both fills must be inside at once, or this barrier times out
        (files / "x").write_text("x")
        return {}

    threads = [threading.Thread(target=cache.get_or_fill, args=(name, fill, IDENTITY)) for name in ("a-1", "b-2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.lookup("a-1") is not None
    assert cache.lookup("b-2") is not None


_PROCESS_FILL = """
import sys, time
from pathlib import Path
from sie.worker.artifacts import ArtifactCache

root, log, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
(ready / sys.argv[4]).touch()
deadline = time.monotonic() + 30
while len(list(ready.iterdir())) < 4 and time.monotonic() < deadline:  # start all four together
    time.sleep(0.01)

def fill(files):
    with log.open("a") as handle:
        handle.write("fill\\n")
    time.sleep(0.5)
    (files / "model.bin").write_bytes(b"1" * 64)
    return {}

print(ArtifactCache(root).get_or_fill("m-1", fill, {"kind": "test"}).files)
"""


def test_four_processes_fill_once(tmp_path: Path) -> None:
    root, log, ready = tmp_path / "cache", tmp_path / "fills.log", tmp_path / "ready"
    ready.mkdir()
    command = [sys.executable, "-c", _PROCESS_FILL, str(root), str(log), str(ready)]
    processes = [subprocess.Popen([*command, str(n)], stdout=subprocess.PIPE, text=True) for n in range(4)]
    outputs = [process.communicate(timeout=60)[0].strip() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0, 0]
    assert log.read_text() == "fill\n"
    assert set(outputs) == {str(root / "artifacts" / "m-1" / FILES)}
