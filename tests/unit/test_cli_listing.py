"""How listings print: a table as wide as the terminal in one, tab-separated records one per line (never wrapped)
anywhere else; and `sie models list --json`."""

from __future__ import annotations

import io
import json

from rich.console import Console
from typer.testing import CliRunner

from sie.cli.listing import Column, Listing, note, plain, show
from sie.cli.main import app

LONG = "a-pool-whose-name-is-as-long-as-a-pool-name-may-be-sixty-three-chars"
LISTING = Listing("pools", [Column("name", overflow="fold"), *plain("state", "loaded")],
                  [(LONG, "active", "model-a\nmodel-b"), ("short", "pending\tnow", "")])  # fmt: skip


def test_outside_a_terminal_each_record_is_one_tab_separated_line() -> None:
    out = io.StringIO()
    console = Console(file=out, width=40)  # not a terminal: the width does not wrap anything
    show(LISTING, console)
    note("more: " + "x" * 100, console)
    assert out.getvalue().splitlines() == [
        "# pools", "name\tstate\tloaded", f"{LONG}\tactive\tmodel-a, model-b", "short\tpending now\t",
        "more: " + "x" * 100,
    ]  # fmt: skip


def test_in_a_terminal_the_table_fits_its_width() -> None:
    out = io.StringIO()
    console = Console(file=out, width=50, force_terminal=True, color_system=None)
    show(LISTING, console)
    lines = out.getvalue().splitlines()
    assert lines[0].strip() == "pools" and all(len(line) <= 50 for line in lines)
    assert "".join(line.split("│")[1].strip() for line in lines if line.count("│") > 2).startswith(LONG[:20])


def test_models_list_prints_lines_or_json(monkeypatch, baseline_catalog_dir) -> None:
    monkeypatch.setenv("SIE_MODELS_DIR", str(baseline_catalog_dir / "models"))
    monkeypatch.setenv("SIE_BUNDLES_DIR", str(baseline_catalog_dir / "bundles"))
    runner = CliRunner()
    lines = runner.invoke(app, ["models", "list"])
    assert lines.exit_code == 0, lines.output
    records = [line.split("\t") for line in lines.stdout.splitlines()]
    assert all(len(record) == 2 for record in records)
    document = json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)
    assert [[model["id"], ",".join(model["outputs"])] for model in document["models"]] == records
