"""Start-up checks of the Python environment that would otherwise fail late and confusingly."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

ONNXRUNTIME_BUILDS = ("onnxruntime", "onnxruntime-gpu")


class EnvironmentProblem(RuntimeError):
    """The installed packages cannot work together; the message says how to fix it."""


def _is_installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check_onnxruntime_builds(is_installed: Callable[[str], bool] = _is_installed) -> None:
    """Refuse both onnxruntime builds at once: they install the same `onnxruntime` import package."""
    installed = [name for name in ONNXRUNTIME_BUILDS if is_installed(name)]
    if len(installed) > 1:
        raise EnvironmentProblem(
            "Both onnxruntime and onnxruntime-gpu are installed. They ship the same `onnxruntime` "
            "import package and break each other. Fix: `pip uninstall -y onnxruntime onnxruntime-gpu`, "
            "then `pip install 'sie[cpu]'` on CPU machines or `pip install 'sie[gpu]'` on GPU machines."
        )
