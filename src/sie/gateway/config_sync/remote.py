"""The config service as the gateway reads it (contracts Part A §2.4): the HTTP client of `/epoch`, `/bundles`,
`/bundles/{id}` and `/export` with `SIE_ADMIN_TOKEN` as the bearer, and the parsing of an export body into the model
set it describes (seed 000 §4.1 step 3). httpx failures become ConfigServiceError here and nowhere else; YAML
parsing runs off the event loop. Never writes the registry: `sync` does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Self
from urllib.parse import quote

import attrs
import httpx

from sie.catalog import Bundle, Catalog, CatalogError, ModelConfig, load_yaml, parse_bundle, parse_model_config
from sie.gateway.config_sync.state import ModelSource

logger = logging.getLogger(__name__)

CONFIGS_PREFIX = "/v1/configs"
DEFAULT_TIMEOUT_S = 10.0


class ConfigServiceError(Exception):
    """The config service could not be reached or answered something unusable (one attempt failed)."""


@attrs.frozen
class RemoteEpoch:
    """`GET /v1/configs/epoch`: the authoritative epoch and the two fingerprints (`""` = unavailable)."""

    epoch: int
    bundles_hash: str = ""
    bundle_config_hashes_hash: str = ""


class ConfigServiceClient:
    """One httpx.AsyncClient, reused for every call; an async context manager that closes it."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    @classmethod
    def create(
        cls, base_url: str, admin_token: str | None, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> ConfigServiceClient:
        """No Authorization header when the token is empty (seed 000 §13)."""
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=DEFAULT_TIMEOUT_S, transport=transport
        )
        return cls(http)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def _get(self, path: str) -> httpx.Response:
        try:
            response = await self._http.get(f"{CONFIGS_PREFIX}{path}")
        except httpx.HTTPError as exc:
            raise ConfigServiceError(f"GET {CONFIGS_PREFIX}{path}: {exc!r}") from exc
        if response.status_code != httpx.codes.OK:
            raise ConfigServiceError(f"GET {CONFIGS_PREFIX}{path}: HTTP {response.status_code}")
        return response

    async def _get_json(self, path: str) -> dict[str, Any]:
        response = await self._get(path)
        try:
            body = response.json()
        except ValueError as exc:
            raise ConfigServiceError(f"GET {CONFIGS_PREFIX}{path}: invalid JSON") from exc
        if not isinstance(body, dict):
            raise ConfigServiceError(f"GET {CONFIGS_PREFIX}{path}: expected a JSON object")
        return body

    async def epoch(self) -> RemoteEpoch:
        body = await self._get_json("/epoch")
        epoch = body.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigServiceError(f"GET /epoch: bad epoch {epoch!r}")
        # A missing fingerprint is the legacy form of the "" sentinel.
        return RemoteEpoch(epoch, _text(body.get("bundles_hash")), _text(body.get("bundle_config_hashes_hash")))

    async def bundles(self) -> list[Bundle]:
        """The two-phase bundle fetch: the id list, then each bundle's YAML (seed 000 §4.1 step 2)."""
        listing = (await self._get_json("/bundles")).get("bundles")
        if not isinstance(listing, list):
            raise ConfigServiceError("GET /bundles: expected a 'bundles' list")
        ids = [row.get("bundle_id") for row in listing if isinstance(row, dict)]
        if len(ids) != len(listing) or not all(isinstance(bundle_id, str) and bundle_id for bundle_id in ids):
            raise ConfigServiceError("GET /bundles: every row needs a bundle_id")
        texts = [(await self._get(f"/bundles/{quote(bundle_id, safe='')}")).text for bundle_id in ids]
        return await asyncio.to_thread(_parse_bundles, ids, texts)

    async def export(self) -> dict[str, Any]:
        body = await self._get_json("/export")
        if not isinstance(body.get("models"), list):
            raise ConfigServiceError("GET /export: expected a 'models' list")
        return body


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _parse_bundles(ids: list[str], texts: list[str]) -> list[Bundle]:
    bundles = []
    for bundle_id, text in zip(ids, texts, strict=True):
        source = f"{CONFIGS_PREFIX}/bundles/{bundle_id}"
        try:
            bundles.append(parse_bundle(load_yaml(text, source), source))
        except CatalogError as exc:
            raise ConfigServiceError(f"bundle '{bundle_id}' does not parse: {exc}") from exc
    return bundles


@attrs.frozen
class ExportModels:
    """The parsed export: the models by id with their source, and how many rows failed out of `total`."""

    models: Mapping[str, tuple[ModelConfig, ModelSource]]
    failed: int
    total: int


def parse_export(body: Mapping[str, Any], catalog: Catalog) -> ExportModels:
    """Parse every row against `catalog`'s bundles (a model no bundle runs counts as failed).

    Pure: rows without a config body are skipped; malformed, unparseable or unroutable rows are counted as failed
    and logged, and the caller applies the set only when nothing failed.
    """
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
