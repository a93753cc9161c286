"""Turn a `GET /v1/configs/export` body into the model set it describes (seed 000 §4.1 step 3).

Pure: rows without a config body are skipped; malformed, unparseable or unroutable rows are counted as failed
and logged, and the caller applies the set only when nothing failed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from sie.catalog import Catalog, CatalogError, ModelConfig, load_yaml, parse_model_config
from sie.gateway.config_sync.state import ModelSource

logger = logging.getLogger(__name__)


@attrs.frozen
class ExportModels:
    """The parsed export: the models by id with their source, and how many rows failed out of `total`."""

    models: Mapping[str, tuple[ModelConfig, ModelSource]]
    failed: int
    total: int


def parse_export(body: Mapping[str, Any], catalog: Catalog) -> ExportModels:
    """Parse every row against `catalog`'s bundles (a model no bundle runs counts as failed)."""
    rows = body.get("models") or []
    models: dict[str, tuple[ModelConfig, ModelSource]] = {}
    failed = 0
    for index, row in enumerate(rows):
        try:
            parsed = _parse_row(row, index, catalog)
        except (CatalogError, ValueError) as exc:
            logger.warning("config export: row %d failed: %s", index, exc)
            failed += 1
            continue
        if parsed is not None:
            models[parsed[0].sie_id] = parsed
    return ExportModels(models, failed, len(rows))


def _parse_row(row: Any, index: int, catalog: Catalog) -> tuple[ModelConfig, ModelSource] | None:
    if not isinstance(row, Mapping):
        raise ValueError("expected a JSON object")
    body = row.get("model_config") or row.get("raw_yaml")
    if not body:
        return None
    source_name = f"export[{index}]"
    data = load_yaml(body, source_name) if isinstance(body, str) else body
    model = parse_model_config(data, source_name)
    if not catalog.model_bundles(model):
        raise ValueError(f"model '{model.sie_id}' runs on no known bundle")
    source = ModelSource.FILESYSTEM if row.get("source") == ModelSource.FILESYSTEM else ModelSource.API
    return model, source
