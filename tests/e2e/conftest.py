"""A real `sie run --role all` subprocess serving the baseline catalogue plus one model that cannot load."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from support.servers import REPO, RoleProcess, free_port

GHOST_MODEL = """\
sie_id: acme/ghost
weights_path: /nonexistent/acme-ghost
tasks: {encode: {dense: {dim: 8}}}
profiles:
  default: {adapter_path: 'sie.adapters.dense:OnnxDenseAdapter', max_batch_tokens: 1024}
"""


@pytest.fixture(scope="session")
def all_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of an all-in-one server; on teardown it must exit 0 after SIGTERM (graceful shutdown)."""
    root = tmp_path_factory.mktemp("all-role")
    models = root / "models"
    shutil.copytree(REPO / "config" / "models", models)
    (models / "acme__ghost.yaml").write_text(GHOST_MODEL)
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--preload", "sentence-transformers/all-MiniLM-L6-v2"]
    server = RoleProcess("all", args, {"SIE_MODELS_DIR": str(models)}, root / "server.log")
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        yield f"http://127.0.0.1:{port}"
    finally:
        code = server.stop()
    assert code == 0, server.log()
