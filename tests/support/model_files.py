"""Model YAMLs a test writes as an admin would: new model ids over the baseline MiniLM's offline weights."""

from __future__ import annotations

from pathlib import Path

from launcher import REPO
from sie.catalog import dump_yaml, load_yaml

MINILM_YAML = REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml"


def minilm_copy(directory: Path, model_id: str) -> Path:
    """`model_id` (default profile only) over the baseline MiniLM, written into `directory`; returns its path."""
    data = load_yaml(MINILM_YAML.read_text())
    data["sie_id"] = model_id
    data["profiles"] = {"default": data["profiles"]["default"]}
    path = directory / f"{model_id.replace('/', '__')}.yaml"
    path.write_text(dump_yaml(data))
    return path
