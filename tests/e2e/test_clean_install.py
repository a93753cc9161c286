"""A clean install: the wheel built from the tree, installed without `-e` into a fresh virtual environment (no
system site-packages), run from a directory that is not the repository. It must carry the baseline catalogue.

The venv is made without pip and filled by this interpreter's pip (`pip --python`, pip's own way of installing
into another environment): the older pip that ensurepip bundles takes far longer over the hundred-odd wheels, and
nothing here runs pip inside the venv. Bytecode is not compiled at install time (`--no-compile`): the modules that
run compile when first imported, as they would in any venv whose .pyc files are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import REPO, RoleProcess, free_port
from sie.catalog import load_catalog

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INSTALL_TIMEOUT_S = 600
MODEL = "sentence-transformers/paraphrase-MiniLM-L3-v2"


def _environment() -> dict[str, str]:
    # Nothing that points back into the repository: no SIE_* variables, no PYTHONPATH.
    return {name: value for name, value in os.environ.items() if not name.startswith("SIE_") and name != "PYTHONPATH"}


def _run(command: list[str], cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=timeout_s, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The `bin/` of a fresh venv holding only the wheel (with the `cpu` extra) and its dependencies."""
    root = tmp_path_factory.mktemp("clean-install")
    # What the Dockerfile copies: the project file, the README and src/ (the catalogue lives in src/sie/config).
    source = root / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(REPO / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    wheels = root / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(source), "-w", str(wheels)], root)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("sie-*.whl")
    venv = root / "venv"
    created = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    assert created.returncode == 0, created.stderr
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-compile"]
    pip.append(f"{wheel}[cpu]")
    installed = _run(pip, root, INSTALL_TIMEOUT_S)
    assert installed.returncode == 0, installed.stderr[-4000:]
    yield venv / "bin"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory with nothing of the repository in it."""
    directory = tmp_path / "elsewhere"
    directory.mkdir()
    return directory


def test_the_package_is_imported_from_the_venv_not_the_repository(installed: Path, elsewhere: Path) -> None:
    found = _run([str(installed / "python"), "-c", "import sie; print(sie.__file__)"], elsewhere)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(installed.parent)


def test_models_list_shows_the_baseline_catalogue(installed: Path, elsewhere: Path) -> None:
    listed = _run([str(installed / "sie"), "models", "list"], elsewhere)
    assert listed.returncode == 0, listed.stderr
    baseline = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    assert {line.split("\t")[0] for line in listed.stdout.splitlines()} == set(baseline.entries)


def test_run_help_works(installed: Path, elsewhere: Path) -> None:
    helped = _run([str(installed / "sie"), "run", "--role", "all", "--help"], elsewhere)
    assert helped.returncode == 0, helped.stderr
    assert "--preload" in helped.stdout and "--models-dir" in helped.stdout


def test_role_all_serves_the_baseline_models(installed: Path, elsewhere: Path) -> None:
    port = free_port()
    server = RoleProcess(
        "all", ["--port", str(port)], {}, elsewhere / "server.log", sie=[str(installed / "sie")], cwd=elsewhere
    )
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/encode/{MODEL}", json={"items": [{"text": "Hello world"}]}, timeout=120
        )
        assert response.status_code == 200, response.text
        vector = np.asarray(response.json()["items"][0]["dense"]["values"])
        dims = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models").get(MODEL).model.dims
        assert vector.shape == (dims["dense"],) and np.all(np.isfinite(vector))
    finally:
        code = server.stop()
    assert code == 0, server.log()
