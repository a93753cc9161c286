"""`sie catalog validate|hashes|resolve`: check a catalogue directory, print its hashes, resolve a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sie.catalog import BundleConflictError, Catalog, ModelNotFoundError, read_catalog
from sie.settings import SettingsError, load_settings

app = typer.Typer(help="Check and inspect a model/bundle catalogue.", no_args_is_help=True, add_completion=False)

DIR_HELP = "Catalogue directory holding bundles/ and models/ (default: SIE_BUNDLES_DIR and SIE_MODELS_DIR)."
CatalogDir = Annotated[Path | None, typer.Argument(help=DIR_HELP)]
PoolOption = Annotated[str | None, typer.Option("--pool", help="Hash only the models assigned to this pool.")]
BundleOption = Annotated[str | None, typer.Option("--bundle", help="Require this bundle.")]
Spec = Annotated[str, typer.Argument(help="Model spec: [bundle:/]org/model[:profile].")]


def _dirs(directory: Path | None) -> tuple[Path, Path]:
    if directory is not None:
        return directory / "bundles", directory / "models"
    try:
        settings = load_settings()
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    return Path(settings.catalog.bundles_dir), Path(settings.catalog.models_dir)


def _load(directory: Path | None) -> Catalog:
    catalog, errors = read_catalog(*_dirs(directory))
    if errors:
        for error in errors:
            typer.echo(f"error: {error.describe()}", err=True)
        raise typer.Exit(1)
    return catalog


@app.command()
def validate(directory: CatalogDir = None) -> None:
    """Check every bundle and model file; print each problem with its file and field."""
    catalog = _load(directory)
    typer.echo(f"ok: {len(catalog.bundles)} bundles, {len(catalog.models)} models, {len(catalog.entries)} ids")


@app.command()
def hashes(directory: CatalogDir = None, pool: PoolOption = None) -> None:
    """Print each bundle's bundle_config_hash and the control-plane fingerprints."""
    catalog = _load(directory)
    for name in sorted(catalog.bundles):
        digest = catalog.bundle_config_hash(name, pool.lower() if pool else None)
        typer.echo(f"bundle {name}: {digest or '(no models)'}")
    typer.echo(f"bundles_hash: {catalog.bundles_hash}")
    typer.echo(f"bundle_config_hashes_hash: {catalog.bundle_config_hashes_hash}")


@app.command()
def resolve(spec: Spec, directory: CatalogDir = None, bundle: BundleOption = None) -> None:
    """Show which bundle and profile a model spec resolves to."""
    catalog = _load(directory)
    try:
        resolution = catalog.resolve(spec, bundle)
    except (ModelNotFoundError, BundleConflictError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    entry = resolution.entry
    typer.echo(f"model: {entry.model_id}")
    typer.echo(f"base model: {entry.model.sie_id}")
    typer.echo(f"profile: {entry.profile}")
    typer.echo(f"bundle: {resolution.bundle.name}")
    typer.echo(f"compatible bundles: {', '.join(resolution.compatible_bundles)}")
    typer.echo(f"adapter: {entry.model.resolve_profile(entry.profile).adapter_path}")
