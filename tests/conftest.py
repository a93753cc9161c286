"""Shared pytest fixtures: repository paths and the public SIE catalogue from the sie-server wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# gcsfs reads this once at import; left at its default every call to the GCS emulator hangs for 60 s
# (shared/reference/dependencies.md §3). Set before anything can import gcsfs.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# The reference implementations (torch) run tiny models in each pytest-xdist worker of a suite that keeps both cores
# busy, where their OpenMP threads only wait for each other: one thread each (set before anything imports torch).
# The role processes the tests start inherit it; onnxruntime's thread pools do not read it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Fixture modules registered once, so a session fixture (the nats-server, the object stores) is one per session
# however many test modules ask for it (a module that imports a fixture gets a copy of its own).
pytest_plugins = ["support.nats_server", "support.object_stores", "support.scheduling"]

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO_ROOT / ".cache"
PUBLIC_SIE_SERVER = "sie-server==0.10.1"
PUBLIC_WHEEL = CACHE_DIR / "wheels" / "sie_server-0.10.1-py3-none-any.whl"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def baseline_catalog_dir() -> Path:
    return REPO_ROOT / "config"


def fetch_public_wheel() -> Path:
    """Download the public sie-server wheel once (PyPI); `make test` does this before pytest runs."""
    if not PUBLIC_WHEEL.exists():
        PUBLIC_WHEEL.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
            "--quiet", "-d", str(PUBLIC_WHEEL.parent), PUBLIC_SIE_SERVER,
        ]  # fmt: skip
        subprocess.run(command, check=True, timeout=300)
    return PUBLIC_WHEEL


@pytest.fixture(scope="session")
def public_wheel() -> Path:
    """The public sie-server 0.10.1 wheel (its pure-Python modules import from the zip: a reference to compare with)."""
    return fetch_public_wheel()


@pytest.fixture(scope="session")
def public_catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bundles/` and `models/` of the public SIE 0.10.1 catalogue, read from the wheel's zip."""
    target = tmp_path_factory.mktemp("public-catalog")
    with zipfile.ZipFile(fetch_public_wheel()) as wheel:
        for name in wheel.namelist():
            for kind in ("bundles", "models"):
                prefix = f"sie_server/{kind}/"
                if name.startswith(prefix) and name.endswith(".yaml"):
                    destination = target / kind / name[len(prefix) :]
                    destination.parent.mkdir(parents=True, exist_ok=True)
                    destination.write_bytes(wheel.read(name))
    return target
