"""`sie models list|pull`: show the catalogue's models and fetch their files ahead of first use."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from sie.catalog import Catalog, ModelNotFoundError, load_catalog
from sie.catalog.errors import CatalogErrors
from sie.settings import Settings, SettingsError, load_settings

app = typer.Typer(help="List and pre-fetch models.", no_args_is_help=True, add_completion=False)
console = Console(stderr=True)

ModelArgs = Annotated[list[str] | None, typer.Argument(help="Model ids (variants `org/model:profile` too).")]
AllOption = Annotated[bool, typer.Option("--all", help="Every model of the catalogue, every profile.")]


def _settings_and_catalog() -> tuple[Settings, Catalog]:
    try:
        settings = load_settings()
        return settings, load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    except (SettingsError, CatalogErrors) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command("list")
def list_models(
    raw: Annotated[bool, typer.Option("--json", help="Print a JSON document: {models: [{id, outputs}]}.")] = False,
) -> None:
    """Print every servable model id with its outputs, one per line (tab-separated)."""
    _, catalog = _settings_and_catalog()
    entries = sorted(catalog.entries.items())
    if raw:
        models = [{"id": model_id, "outputs": list(entry.model.outputs)} for model_id, entry in entries]
        typer.echo(json.dumps({"models": models}, indent=2))
        return
    for model_id, entry in entries:
        typer.echo(f"{model_id}\t{','.join(entry.model.outputs)}")


def _targets(catalog: Catalog, models: list[str] | None, every: bool) -> list[str]:
    if every:
        return sorted(catalog.entries)
    if not models:
        typer.echo("error: name at least one model, or pass --all", err=True)
        raise typer.Exit(2)
    try:
        return [catalog.get(model_id).model_id for model_id in models]
    except ModelNotFoundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def pull(models: ModelArgs = None, every: AllOption = False) -> None:
    """Download each model's files into SIE_MODEL_CACHE and convert checkpoints to ONNX, showing every file's
    size and each model's total (bars in a terminal, plain lines otherwise)."""
    # The worker's loader (onnx, huggingface_hub, the converters) is imported only when a pull runs, so every other
    # `sie` command, `sie run --role gateway` above all, starts without it.
    from sie.cli.pull_progress import pull_display
    from sie.worker.errors import ModelLoadError
    from sie.worker.loading import ModelLoader

    settings, catalog = _settings_and_catalog()
    loader = ModelLoader.from_settings(settings.worker)
    failures = 0
    with pull_display(console, lambda line: typer.echo(line, err=True)) as display:
        for model_id in _targets(catalog, models, every):
            entry = catalog.get(model_id)
            try:
                files = loader.prepare(entry.model, entry.profile, model_id, display.start(model_id))
            except ModelLoadError as exc:
                failures += 1
                display.fail(model_id, f"{exc.message} ({exc.error_class})")
                continue
            display.finish(model_id)
            typer.echo(f"{model_id}: {files.graph}")
    raise typer.Exit(1 if failures else 0)
