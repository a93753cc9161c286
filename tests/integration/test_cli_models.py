"""`sie models list|pull` through the CLI, against the repository's model cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sie.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(autouse=True)
def repo_cache(monkeypatch) -> None:
    monkeypatch.setenv("SIE_MODEL_CACHE", str(REPO / ".cache" / "models"))


def test_list() -> None:
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0
    assert "rasyosef/splade-tiny\tsparse,score" in result.output


def test_pull_prepares_the_graph() -> None:
    result = runner.invoke(app, ["models", "pull", "rasyosef/splade-tiny"])
    assert result.exit_code == 0, result.output
    graph = Path(result.output.split("rasyosef/splade-tiny: ", 1)[1].split()[0].strip())
    assert graph.suffix == ".onnx"


def test_pull_needs_a_model() -> None:
    assert runner.invoke(app, ["models", "pull"]).exit_code == 2
    unknown = runner.invoke(app, ["models", "pull", "acme/missing"])
    assert unknown.exit_code == 2 and "Model 'acme/missing' not found" in unknown.output


def test_pull_reports_a_model_that_cannot_be_fetched(tmp_path: Path, monkeypatch) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "ghost.yaml").write_text(
        "sie_id: acme/ghost\nweights_path: /nonexistent/ghost\nprofiles:\n"
        "  default: {adapter_path: 'sie.adapters.dense:D', max_batch_tokens: 8}\n"
    )
    monkeypatch.setenv("SIE_MODELS_DIR", str(models))
    result = runner.invoke(app, ["models", "pull", "--all"])
    assert result.exit_code == 1
    assert "NOT_FOUND" in result.output and "acme/ghost" in result.output
