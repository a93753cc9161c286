"""`sie models list|pull`: show the catalogue's models and fetch their files ahead of first use."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from sie.catalog import Catalog, ModelNotFoundError, load_catalog
from sie.catalog.errors import CatalogErrors
from sie.settings import Settings, SettingsError, load_settings
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader

app = typer.Typer(help="List and pre-fetch models.", no_args_is_help=True)
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
def list_models() -> None:
    """Print every servable model id with its outputs."""
    _, catalog = _settings_and_catalog()
    for model_id, entry in sorted(catalog.entries.items()):
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
    """Download each model's files into SIE_MODEL_CACHE and convert checkpoints to ONNX, with progress."""
    settings, catalog = _settings_and_catalog()
    loader = ModelLoader.from_settings(settings.worker)
    failures = 0
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        for model_id in _targets(catalog, models, every):
            task = progress.add_task(model_id, total=None)

            def report(stage: str, done: int, total: int | None, task: int = task, name: str = model_id) -> None:
                progress.update(task, completed=done, total=total, description=f"{name} [{stage}]")

            entry = catalog.get(model_id)
            try:
                files = loader.prepare(entry.model, entry.profile, model_id, report)
            except ModelLoadError as exc:
                failures += 1
                progress.update(task, description=f"{model_id} [failed]")
                console.print(f"[red]error[/red]: {exc.message} ({exc.error_class})")
                continue
            progress.update(task, description=f"{model_id} [ready]", completed=progress.tasks[task].total or 1)
            typer.echo(f"{model_id}: {files.graph}")
    raise typer.Exit(1 if failures else 0)
