"""How `sie models pull` shows its progress: every file of every source with its size on disk, and each model's
total. In a terminal a bar per source counts the real bytes; anywhere else (a pipe, a CI or container log) the
display is plain lines, one per finished stage and one per file, with no bar, colour or carriage return.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from rich.console import Console
from rich.filesize import decimal
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from sie.worker.artifacts import STAGE_FILE, ProgressCallback, ProgressEvent


@attrs.define
class FileTally:
    """The files of one model, each counted once (a tokenizer read from the model's own source repeats them)."""

    sizes: dict[tuple[str, str], int] = attrs.Factory(dict)

    def add(self, event: ProgressEvent) -> bool:
        """Count a `file` event; False when this file of this source was counted already."""
        key = (event.source, event.path or "")
        known = key in self.sizes
        self.sizes[key] = event.done_bytes
        return not known

    def summary(self) -> str:
        files = len(self.sizes)
        return f"{files} file{'s' if files != 1 else ''}, {decimal(sum(self.sizes.values()))} in all"


class PlainPullDisplay:
    """Line by line, for output that is not a terminal."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self._tally = FileTally()
        self._shown: set[tuple[str, str]] = set()

    def __enter__(self) -> PlainPullDisplay:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def start(self, model_id: str) -> ProgressCallback:
        """The callback for fetching `model_id`'s files."""
        self._tally, self._shown = FileTally(), set()
        return lambda event: self._on_event(model_id, event)

    def _on_event(self, model_id: str, event: ProgressEvent) -> None:
        if event.stage == STAGE_FILE:
            if self._tally.add(event):
                self._echo(f"{model_id}:   {event.path}  {decimal(event.done_bytes)}")
            return
        finished = event.total_bytes is not None and event.done_bytes >= event.total_bytes
        if finished and (event.stage, event.source) not in self._shown:
            self._shown.add((event.stage, event.source))
            self._echo(f"{model_id}: {event.stage} {event.source}: {decimal(event.done_bytes)}")

    def finish(self, model_id: str) -> None:
        self._echo(f"{model_id}: {self._tally.summary()}")

    def fail(self, model_id: str, message: str) -> None:
        self._echo(f"{model_id}: failed: {message}")


class BarsPullDisplay:
    """Rich bars with real byte counts, one per source and stage, for a terminal."""

    def __init__(self, console: Console) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        self._progress = Progress(*columns, console=console, transient=False)
        self._tally = FileTally()
        self._tasks: dict[tuple[str, str], TaskID] = {}

    def __enter__(self) -> BarsPullDisplay:
        self._progress.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._progress.stop()

    def start(self, model_id: str) -> ProgressCallback:
        """The callback for fetching `model_id`'s files."""
        self._tally, self._tasks = FileTally(), {}
        self._progress.console.print(f"[bold]{model_id}[/bold]")
        return self._on_event

    def _on_event(self, event: ProgressEvent) -> None:
        if event.stage == STAGE_FILE:
            if self._tally.add(event):
                self._progress.console.print(f"  {event.path}  {decimal(event.done_bytes)}")
            return
        key = (event.stage, event.source)
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(f"  {event.stage} {event.source}", total=event.total_bytes)
        self._progress.update(self._tasks[key], completed=event.done_bytes, total=event.total_bytes)
        if event.total_bytes is not None and event.done_bytes >= event.total_bytes:
            self._progress.refresh()  # a finished bar shows its full size before the file lines below it

    def finish(self, model_id: str) -> None:
        self._progress.console.print(f"  {self._tally.summary()}")

    def fail(self, model_id: str, message: str) -> None:
        self._progress.console.print(f"  [red]failed[/red]: {message}")


def pull_display(console: Console, echo: Callable[[str], None]) -> PlainPullDisplay | BarsPullDisplay:
    """Bars when `console` is a terminal, plain lines through `echo` otherwise."""
    return BarsPullDisplay(console) if console.is_terminal else PlainPullDisplay(echo)
