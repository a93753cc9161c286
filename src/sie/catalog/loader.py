"""Read a catalogue from `bundles/*.yaml` and `models/*.yaml` directories into a Catalog.

`check_catalog` returns every problem with its file, model and field; `load_catalog` raises them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sie.catalog.catalog import Catalog
from sie.catalog.errors import CatalogErrors, ConfigError
from sie.catalog.parse import parse_bundle, parse_model_config
from sie.catalog.yamlio import load_yaml


def _yaml_files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.glob("*.y*ml") if path.suffix in (".yaml", ".yml"))


def _read_dir(directory: Path, parse, errors: list[ConfigError]) -> list[tuple[Any, str]]:  # noqa: ANN001
    """`(parsed, source path)` for every file that parses; the others' errors go to `errors`."""
    parsed = []
    if not directory.is_dir():
        errors.append(ConfigError("directory not found", source=str(directory)))
        return parsed
    for path in _yaml_files(directory):
        source = str(path)
        try:
            parsed.append((parse(load_yaml(path.read_text(encoding="utf-8"), source), source), source))
        except CatalogErrors as exc:
            errors.extend(exc.errors)
        except ConfigError as exc:
            errors.append(exc)
    return parsed


def _check_duplicates(items: list, key: str, kind: str, errors: list[ConfigError]) -> None:  # noqa: ANN001
    seen: dict[str, str] = {}
    for item in items:
        name = getattr(item, key)
        folded = name.casefold()
        if folded in seen:
            errors.append(ConfigError(f"duplicate {kind} id (also '{seen[folded]}')", model_id=name, field=key))
        seen[folded] = name


def read_catalog(bundles_dir: Path, models_dir: Path) -> tuple[Catalog, list[ConfigError]]:
    """Parse every file that parses; return the catalog and the problems found (bad files left out; the catalog
    carries them as `problems`)."""
    errors: list[ConfigError] = []
    bundles = [bundle for bundle, _ in _read_dir(Path(bundles_dir), parse_bundle, errors)]
    read_models = _read_dir(Path(models_dir), parse_model_config, errors)
    models = [model for model, _ in read_models]
    _check_duplicates(bundles, "name", "bundle", errors)
    _check_duplicates(models, "sie_id", "model", errors)
    for model, source in read_models:
        for name in model.profiles:
            module = model.resolve_profile(name).adapter_module
            if module and not any(bundle.runs(module) for bundle in bundles):
                errors.append(
                    ConfigError(
                        f"Adapter(s) not in any known bundle: {module}",
                        source=source,
                        model_id=model.sie_id,
                        field=f"profiles.{name}.adapter_path",
                    )
                )
    return Catalog(bundles, models, errors), errors


def bundle_errors(errors: list[ConfigError], bundles_dir: Path) -> list[ConfigError]:
    """The problems of `read_catalog` that are about the bundle files (what every model routes to)."""
    return [error for error in errors if error.source and Path(error.source).is_relative_to(bundles_dir)]


def load_catalog(bundles_dir: Path, models_dir: Path) -> Catalog:
    """Load a catalogue, raising CatalogErrors when any file or field is invalid."""
    catalog, errors = read_catalog(bundles_dir, models_dir)
    if errors:
        raise CatalogErrors(errors)
    return catalog
