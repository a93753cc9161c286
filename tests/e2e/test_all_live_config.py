"""`sie run --role all` takes model configuration while it runs (issue 32): `sie config apply` pointed at its port
adds a model that `/v1/models` lists and that serves at once, a config store keeps it across a restart, and
`sie config delete` takes it away again, all without restarting the server for the change. Marked slow: it
starts real server processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import RoleProcess, free_port
from support.model_files import minilm_copy
from support.polling import holds_within

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ADDED = "acme/minilm-live"
WAIT_S = 30.0


def sie_config(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sie.cli.main", "config", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def start_all(root: Path, port: int, store: Path, attempt: int) -> RoleProcess:
    env = {"SIE_CONFIG_STORE_DIR": str(store), "SIE_CONFIG_POLL_INTERVAL_S": "1"}
    args = ["--host", "127.0.0.1", "--port", str(port), "--preload", MINILM]
    server = RoleProcess("all", args, env, root / f"all-{attempt}.log")
    server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
    return server


def listed(url: str) -> set[str]:
    return {model["name"] for model in httpx.get(f"{url}/v1/models", timeout=10).json()["models"]}


def vector(url: str, model: str) -> np.ndarray:
    response = httpx.post(f"{url}/v1/encode/{model}", json={"items": [{"text": "Hello world"}]}, timeout=60)
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["items"][0]["dense"]["values"], dtype=np.float32)


def test_config_written_to_the_all_role_is_served_kept_and_removed_while_it_runs(tmp_path: Path) -> None:
    port, store = free_port(), tmp_path / "store"
    url = f"http://127.0.0.1:{port}"
    server = start_all(tmp_path, port, store, 1)
    try:
        assert ADDED not in listed(url)
        applied = sie_config("apply", str(minilm_copy(tmp_path, ADDED)), "--url", url)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert holds_within(lambda: ADDED in listed(url), WAIT_S), server.log()
        assert np.allclose(vector(url, ADDED), vector(url, MINILM), atol=1e-6)  # the same weights, a new name
        epoch = sie_config("epoch", "--url", url)
        assert epoch.returncode == 0 and "1" in epoch.stdout, epoch.stdout + epoch.stderr
    finally:
        assert server.stop() == 0, server.log()

    server = start_all(tmp_path, port, store, 2)  # the store gives the model back
    try:
        assert holds_within(lambda: ADDED in listed(url), WAIT_S), server.log()
        assert vector(url, ADDED).shape == (384,)
        deleted = sie_config("delete", ADDED, "--url", url)
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert holds_within(lambda: ADDED not in listed(url), WAIT_S), server.log()
        assert MINILM in listed(url)
    finally:
        assert server.stop() == 0, server.log()
