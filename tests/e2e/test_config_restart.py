"""The config service survives its own crashes (issue 14 §2, seed 000 §3/§9): a real `sie run --role config` with a
local store takes a stream of writes from several clients, is killed with SIGKILL while writes are in flight, and is
started again, three times over. Every acknowledged model is back, no stored file is torn, and the epoch moves
with the models: after a restart it is never the epoch of an earlier export with other models. With
SIE_CONFIG_RESTORE=false over stored models the service refuses to start, naming the setting. Marked slow.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest

from launcher import RoleProcess, free_port
from sie.catalog import load_yaml
from sie.control.registry import SOURCE_API
from sie.stores.config_store import model_id_from_file
from support.polling import holds_within

pytestmark = pytest.mark.slow

ADAPTER: Final = "sie.adapters.dense:OnnxDenseAdapter"
WRITERS: Final = 4
ACKS_BEFORE_KILL: Final = 12
CRASHES: Final = 3
# Ids whose old file names collided (`coll-org_/m` and `coll-org/_m` were one file) are written too.
ID_FORMS: Final = ("acme/crash-{n}", "coll-org_/m{n}", "coll-org/_m{n}")


def model_yaml(model_id: str) -> str:
    profiles = f"  default:\n    adapter_path: {ADAPTER}\n    max_batch_tokens: {1024 + len(model_id)}\n"
    return f"sie_id: {model_id}\nhf_id: {model_id}\nprofiles:\n{profiles}"


class ConfigService:
    """One config store directory, served by successive `sie run --role config` processes on one port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "store"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0
        self.process: RoleProcess | None = None

    def start(self, env: dict[str, str] | None = None) -> RoleProcess:
        self.starts += 1
        args = ["--host", "127.0.0.1", "--port", str(self.port)]
        environment = {"SIE_CONFIG_STORE_DIR": str(self.store), **(env or {})}
        self.process = RoleProcess("config", args, environment, self.root / f"config-{self.starts}.log")
        return self.process

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, whatever write is in flight stops where it is."""
        assert self.process is not None
        self.process.process.kill()
        self.process.stop()

    def served(self) -> tuple[int, set[str]]:
        """(epoch, API models) of one export: a pair taken under the write lock, so a state that existed."""
        export = httpx.get(f"{self.url}/v1/configs/export", timeout=10).json()
        return export["epoch"], {row["model_id"] for row in export["models"] if row["source"] == SOURCE_API}


class WriteStream:
    """WRITERS threads POSTing new models until told to stop or the service dies; records each 2xx."""

    def __init__(self, url: str, cycle: int) -> None:
        self.url = url
        self.attempted: set[str] = set()
        self.acked: set[str] = set()
        self.unexpected: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._write, args=([form.format(n=f"{cycle}-{w}-{i}") for i in range(200) for form in ID_FORMS],)
            )  # fmt: skip
            for w in range(WRITERS)
        ]

    def __enter__(self) -> WriteStream:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def _write(self, ids: list[str]) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for model_id in ids:
                if self._stop.is_set():
                    return
                with self._lock:
                    self.attempted.add(model_id)
                try:
                    response = http.post("/v1/configs/models", content=model_yaml(model_id))
                except httpx.HTTPError:
                    return  # the service was killed under this write
                with self._lock:
                    if response.status_code == 201:
                        self.acked.add(model_id)
                    else:
                        self.unexpected.append(f"{model_id}: {response.status_code} {response.text}")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ConfigService]:
    config = ConfigService(tmp_path)
    try:
        yield config
    finally:
        if config.process is not None:
            config.process.stop()


def stored_files_are_whole(store: Path) -> None:
    """Every model file parses and names the id its file name stands for: no kill left a torn file."""
    for path in (store / "models").glob("*.yaml"):
        text = path.read_text()
        assert text, f"{path.name} is empty"
        assert load_yaml(text, path.name)["sie_id"] == model_id_from_file(path.name), path.name


def test_acknowledged_writes_survive_sigkill_and_the_epoch_moves_with_the_models(service: ConfigService) -> None:
    acked_so_far: set[str] = set()
    attempted_so_far: set[str] = set()
    for cycle in range(CRASHES):
        process = service.start()
        process.wait_http_ready(f"{service.url}/readyz")
        restored_epoch, restored = service.served()
        assert acked_so_far <= restored <= attempted_so_far, process.log()
        with WriteStream(service.url, cycle) as stream:
            if not holds_within(lambda s=stream: s.acked_count() >= ACKS_BEFORE_KILL, 60, interval_s=0.05):
                raise AssertionError(f"writes were not acknowledged:\n{process.log()}")
            exported_epoch, exported = service.served()
            service.kill()  # the writers are still sending: some write is in flight
        assert not stream.unexpected, stream.unexpected
        assert exported_epoch >= restored_epoch + ACKS_BEFORE_KILL
        acked_so_far |= stream.acked
        attempted_so_far |= stream.attempted

        stored_files_are_whole(service.store)
        process = service.start()
        process.wait_http_ready(f"{service.url}/readyz")
        epoch, models = service.served()
        assert acked_so_far <= models <= attempted_so_far, "an acknowledged model was lost"
        assert exported <= models
        # The epoch moves with the models: the export's epoch again only with the export's models, else a later one.
        assert epoch > exported_epoch or (epoch == exported_epoch and models == exported), (epoch, exported_epoch)
        assert len(models) <= epoch  # every stored model was created under an epoch stored before it
        service.kill()


def test_restore_off_over_stored_models_refuses_to_start(service: ConfigService) -> None:
    process = service.start()
    process.wait_http_ready(f"{service.url}/readyz")
    created = httpx.post(f"{service.url}/v1/configs/models", content=model_yaml("acme/kept"), timeout=10)
    assert created.status_code == 201, created.text
    assert process.stop() == 0
    refused = service.start({"SIE_CONFIG_RESTORE": "false"})
    refused.process.wait(timeout=120)
    assert refused.stop() == 1
    assert "SIE_CONFIG_RESTORE=true" in refused.log() and "holds 1 models" in refused.log()
    process = service.start()
    process.wait_http_ready(f"{service.url}/readyz")
    assert service.served() == (1, {"acme/kept"})
