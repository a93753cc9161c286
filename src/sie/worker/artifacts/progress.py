"""The progress hook that `sie models pull` displays: stage names and the callback type.

Callbacks run on the resolving thread (an executor thread in the worker); a display that updates an
event-loop object must hand the update over itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

ProgressCallback = Callable[[str, int, int | None], None]
"""`on_progress(stage, done_bytes, total_bytes)`; `total_bytes` is None while the size is unknown."""

STAGE_DOWNLOAD: Final = "download"
STAGE_EXTRACT: Final = "extract"
STAGE_CACHED: Final = "cached"


def no_progress(stage: str, done_bytes: int, total_bytes: int | None) -> None:
    """The default callback: report nothing."""
