"""`sie bench` against a real server (`sie run --role all --backend null`: answers without running a model, so the
test is quick): a row per pair of concurrency and batch with throughput, latencies and no errors, as a table or
JSON; a model the server does not have is a usage error naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher import serving_all
from sie.cli.bench import measure
from sie.cli.main import app

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
runner = CliRunner()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("bench") / "all.log"
    with serving_all(log, ["--backend", "null", "--devices", "cpu"], {}) as url:
        yield url


def test_every_pair_is_measured_as_json(server: str) -> None:
    result = runner.invoke(app, ["bench", "--url", server, "--model", MINILM, "--concurrency", "1,4", "--batch",
                                 "1,8", "--seconds", "0.5", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(row["concurrency"], row["batch"]) for row in document["rows"]] == [(1, 1), (1, 8), (4, 1), (4, 8)]
    for row in document["rows"]:
        assert row["requests"] > 0 and row["errors"] == 0 and row["items_per_s"] == pytest.approx(
            row["requests_per_s"] * row["batch"], rel=0.01)  # fmt: skip
        assert 0 < row["p50_ms"] <= row["p99_ms"]


def test_outside_a_terminal_the_table_is_one_line_per_pair(server: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "--url", server, "--model", MINILM, "--concurrency", "2", "--batch", "4",
                                 "--seconds", "0.3"])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = lines.index("clients\tbatch\trequests/s\titems/s\tp50 ms\tp99 ms\terrors")
    (row,) = lines[header + 1 :]
    assert row.split("\t")[:2] == ["2", "4"] and row.split("\t")[-1] == "0"


def test_bad_options_and_unknown_models_are_usage_errors(server: str) -> None:
    assert runner.invoke(app, ["bench", "--url", server, "--model", MINILM, "--concurrency", "0"]).exit_code == 2
    unknown = runner.invoke(app, ["bench", "--url", server, "--model", "acme/nothing", "--seconds", "0.2"])
    assert unknown.exit_code == 2 and "acme/nothing" in unknown.output


def test_the_ceiling_column_runs_the_model_here(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """--ceiling loads MiniLM from this machine's catalogue and cache (the server here runs the null backend) and
    adds the items/s it reaches in-process for each batch size."""
    result = runner.invoke(app, ["bench", "--url", server, "--model", MINILM, "--concurrency", "1", "--batch", "1,4",
                                 "--seconds", "0.3", "--ceiling", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    assert [row["batch"] for row in rows] == [1, 4] and all(row["ceiling_items_per_s"] > 0 for row in rows)
    table = runner.invoke(app, ["bench", "--url", server, "--model", MINILM, "--concurrency", "1", "--batch", "2",
                                "--seconds", "0.2", "--ceiling"])  # fmt: skip
    assert "ceiling items/s" in table.stdout


async def test_the_scripts_load_cycles_distinct_bodies_per_client(server: str) -> None:
    """`measure` (what scripts/bench drives servers with): each client walks the bodies from its own start, so every
    body is sent, and a body that fails is counted with its reason."""
    bodies = [{"items": [{"text": f"sentence {index}"}]} for index in range(3)] + [{"items": []}]
    cell = await measure(server, f"/v1/encode/{MINILM}", bodies, 2, 0.5)
    assert cell.batch == 1 and len(cell.latencies_ms) > 0
    assert cell.errors > 0 and cell.first_error.startswith("HTTP 400"), cell.first_error  # the empty body
