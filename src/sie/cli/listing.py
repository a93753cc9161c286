"""Tables for people, lines for scripts: what the listing commands (`sie pools list`, `sie dlq list`, `sie placement
status`, ...) print.

In a terminal a listing is a table as wide as the terminal, long values folded inside their cells. Anywhere else (a
pipe, a file, a CI log) it is a `# title` line, a header line and one line per record, the values separated by tabs,
never wrapped: `sie pools list | grep NAME` finds every record whole, and `cut -f` picks a column. A value's line
breaks become ", " and its tabs spaces there. Every listing command also takes `--json` for the raw document.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from rich.console import Console
from rich.table import Table


@attrs.frozen
class Column:
    """One column: its header, and how a terminal table lays it out (rich's `overflow`, `justify`, `ratio`)."""

    header: str
    overflow: str = "ellipsis"
    justify: str = "left"
    ratio: int | None = None


@attrs.frozen
class Listing:
    """A titled table of string cells, one row per record."""

    title: str
    columns: Sequence[Column]
    rows: Sequence[Sequence[str]]


def plain(*headers: str) -> list[Column]:
    """Columns laid out with rich's defaults."""
    return [Column(header) for header in headers]


def show(listing: Listing, console: Console | None = None) -> None:
    """`listing` as a table in a terminal, else as tab-separated lines (module docstring)."""
    console = console or Console()
    if console.is_terminal:
        table = Table(title=listing.title)
        for column in listing.columns:
            table.add_column(column.header, overflow=column.overflow, justify=column.justify, ratio=column.ratio)  # type: ignore[arg-type]
        for row in listing.rows:
            table.add_row(*row)
        console.print(table)
        return
    lines = [f"# {listing.title}", "\t".join(column.header for column in listing.columns)]
    lines += ["\t".join(_one_line(value) for value in row) for row in listing.rows]
    console.file.write("\n".join(lines) + "\n")


def note(text: str, console: Console | None = None) -> None:
    """A line beside a listing ("no dead letters", "more: …"), never wrapped outside a terminal."""
    console = console or Console()
    if console.is_terminal:
        console.print(text)
    else:
        console.file.write(text + "\n")


def _one_line(value: str) -> str:
    return value.replace("\t", " ").replace("\r\n", ", ").replace("\n", ", ")
