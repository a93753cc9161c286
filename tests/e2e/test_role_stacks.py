"""Each role imports only its stack (issue 25 §1): a real `sie run --role gateway|config|sidecar` run under
`python -X importtime` until it serves `/healthz` writes every module it imported to its log, and none of the
worker's stack is among them. A shared environment starts a role: the other roles' SIE_* variables are ignored and
named in one log line, while a variable that is no setting at all still stops it with the closest setting named."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import RoleProcess, free_port, role_environment

IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$", re.MULTILINE)
IMPORTTIME = (sys.executable, "-X", "importtime", "-m", "sie.cli.main")
WORKER_STACK = ("onnxruntime", "onnx", "huggingface_hub", "gguf", "jinja2", "sie.worker")
# A module each role imports (`sie.roles.ROLE` itself is imported by name, which -X importtime does not list).
SERVES = {"gateway": "sie.gateway.http.app", "config": "sie.control.http.app", "sidecar": "sie.sidecar.sidecar"}
# What each role must not import: the worker's stack everywhere, and the other roles' packages.
FORBIDDEN = {
    "gateway": (*WORKER_STACK, "tokenizers", "sie.tokenization", "sie.sidecar", "sie.control"),
    "config": (*WORKER_STACK, "tokenizers", "sie.tokenization", "sie.sidecar", "sie.gateway"),
    "sidecar": (*WORKER_STACK, "sie.gateway", "sie.control"),
}


def imported_modules(log: str) -> set[str]:
    return set(IMPORT_LINE.findall(log))


def forbidden_imports(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(name for name in modules if any(name == top or name.startswith(f"{top}.") for top in forbidden))


@pytest.mark.parametrize("role", sorted(FORBIDDEN))
def test_a_serving_role_imports_none_of_the_worker_stack(role: str, tmp_path: Path) -> None:
    port = free_port()
    env = {"SIE_IPC_SOCKET_PATH": str(tmp_path / "worker.sock")} if role == "sidecar" else {}
    args = ["--host", "127.0.0.1", "--port", str(port)]
    server = RoleProcess(role, args, env, tmp_path / "role.log", sie=IMPORTTIME)
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/healthz")
    finally:
        server.stop()
    modules = imported_modules(server.log_path.read_text(errors="replace"))
    assert {"sie.cli.run", "sie.roles.serving", SERVES[role]} <= modules  # the log does list the imports
    assert forbidden_imports(modules, FORBIDDEN[role]) == []


def test_a_shared_environment_starts_a_role_and_names_what_it_ignores(tmp_path: Path) -> None:
    port = free_port()
    shared = {"SIE_MODEL_CACHE": str(tmp_path / "models"), "SIE_CONFIG_STORE_DIR": str(tmp_path / "store")}
    server = RoleProcess("gateway", ["--host", "127.0.0.1", "--port", str(port)], shared, tmp_path / "gateway.log")
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/healthz")
    finally:
        assert server.stop() == 0
    notes = [line for line in server.log().splitlines() if "ignores settings of other roles" in line]
    assert len(notes) == 1, server.log()
    assert "SIE_CONFIG_STORE_DIR (read by role config, all); SIE_MODEL_CACHE (read by role worker, all)" in notes[0]


def test_a_variable_that_is_no_setting_stops_the_role_with_the_closest_one_named() -> None:
    env = role_environment("gateway", {"SIE_GATEWAY_PROT": "8080"})
    command = [sys.executable, "-m", "sie.cli.main", "run", "--role", "gateway"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "SIE_GATEWAY_PROT is not a setting of this version" in result.stderr
    assert "did you mean SIE_GATEWAY_PORT?" in result.stderr
