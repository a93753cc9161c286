"""Bodies of the gateway's config read routes (seed 000 §5, §6), built from the registry view: the model and
bundle listings and YAML, resolve, and the worker-ack status of one model. Pure: no HTTP, no I/O;
`gateway.config_routes` serves them.

`ConfigView` is what the routes read: ConfigState in the gateway role, `StaticConfigView` over a plain
catalog getter where nothing syncs (`--role all`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from sie.catalog import Catalog, dump_yaml
from sie.catalog.errors import ModelNotFoundError
from sie.catalog.model import DEFAULT_POOL
from sie.gateway.config_sync.state import ConfigEpoch, ModelSource
from sie.gateway.errors import GatewayError, InvalidRequestError
from sie.wire.health import WorkerHeartbeat

STATUS_SUFFIX = "/status"
STATUS_SOURCE: Final = "gateway-registry"

# The latest heartbeat of every *healthy* worker this gateway knows (WorkerRegistry.healthy_workers).
HeartbeatSource = Callable[[], Sequence[WorkerHeartbeat]]


class BundleNotFoundError(GatewayError, ModelNotFoundError):
    """No bundle by that id; answered as a 404 like an unknown model."""

    code = "bundle_not_found"

    def __init__(self, bundle_id: str) -> None:
        GatewayError.__init__(self, f"Bundle '{bundle_id}' does not exist.", bundle_id=bundle_id)
        self.model_id = bundle_id


@runtime_checkable
class ConfigView(Protocol):
    """The current catalog (call it), each model's source, and the local config epoch."""

    epoch: ConfigEpoch

    def __call__(self) -> Catalog: ...

    def source(self, model_id: str) -> ModelSource: ...


class StaticConfigView:
    """A catalog getter with no config sync behind it: every model is filesystem, the epoch stays 0."""

    def __init__(self, catalog: Callable[[], Catalog]) -> None:
        self._catalog = catalog
        self.epoch = ConfigEpoch()

    def __call__(self) -> Catalog:
        return self._catalog()

    def source(self, model_id: str) -> ModelSource:
        return ModelSource.FILESYSTEM


def models_body(view: ConfigView) -> dict[str, Any]:
    """Every model with its sorted profiles, and each non-default profile again as `model:profile`."""
    catalog = view()
    rows = []
    for model_id, model in sorted(catalog.models.items()):
        source = str(view.source(model_id))
        rows.append({"model_id": model_id, "profiles": sorted(model.profiles), "source": source})
        for profile in sorted(model.profiles):
            entry = catalog.entries.get(f"{model_id}:{profile}")
            if entry is not None and entry.model is model:
                rows.append({"model_id": entry.model_id, "profiles": [profile], "source": source})
    return {"models": rows}


def model_yaml(view: ConfigView, model_id: str) -> str:
    """The model as the gateway knows it: `sie_id`, `source` and the bundles that run it."""
    catalog = view()
    entry = catalog.get(model_id)
    bundles = [bundle.name for bundle in catalog.model_bundles(entry.model)]
    return dump_yaml({"sie_id": entry.model_id, "source": str(view.source(entry.model.sie_id)), "bundles": bundles})


def status_target(catalog: Catalog, path_id: str) -> str | None:
    """The model id a `…/status` path asks about, when the stripped id is a known model (§5 disambiguation)."""
    if not path_id.endswith(STATUS_SUFFIX):
        return None
    stripped = path_id[: -len(STATUS_SUFFIX)]
    return stripped if stripped and catalog.find(stripped) is not None else None


def bundles_body(catalog: Catalog, healthy: Sequence[WorkerHeartbeat]) -> dict[str, Any]:
    """Bundles by priority with their adapter count and how many healthy workers serve each."""
    connected: dict[str, int] = {}
    for heartbeat in healthy:
        connected[heartbeat.bundle] = connected.get(heartbeat.bundle, 0) + 1
    return {
        "bundles": [
            {
                "bundle_id": bundle.name,
                "engine": bundle.engine,
                "priority": bundle.priority,
                "adapter_count": len(bundle.adapters),
                "source": _bundle_source(bundle.extra),
                "connected_workers": connected.get(bundle.name, 0),
            }
            for bundle in catalog.bundles_by_priority
        ]
    }


def bundle_yaml(catalog: Catalog, bundle_id: str) -> str:
    bundle = catalog.bundles.get(bundle_id)
    if bundle is None:
        raise BundleNotFoundError(bundle_id)
    return dump_yaml(
        {
            "name": bundle.name,
            "priority": bundle.priority,
            "engine": bundle.engine,
            "source": _bundle_source(bundle.extra),
            "adapters": list(bundle.adapters),
        }
    )


def resolve_body(catalog: Catalog, request: Any) -> dict[str, Any]:
    """`{"model": "[bundle:/]org/model[:variant]", "bundle"?}` → the resolved bundle and the alternatives."""
    if not isinstance(request, Mapping):
        raise InvalidRequestError("Expected a JSON object", code="invalid_model_spec")
    spec, bundle = request.get("model"), request.get("bundle")
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidRequestError("Missing required field: model", code="missing_field")
    if bundle is not None and not isinstance(bundle, str):
        raise InvalidRequestError("'bundle' must be a string", code="invalid_model_spec")
    resolution = catalog.resolve(spec, bundle)
    return {
        "model": resolution.entry.model_id,
        "resolved_bundle": resolution.bundle.name,
        "compatible_bundles": list(resolution.compatible_bundles),
        "profiles": sorted(resolution.entry.model.profiles),
    }


def _bundle_source(extra: Mapping[str, Any]) -> str:
    source = extra.get("source")
    return source if isinstance(source, str) and source else ModelSource.FILESYSTEM.value


def pool_scope(pool: str | None) -> str:
    """The materialised pool a worker serves: its pool lower-cased, `default` when empty."""
    return (pool or "").strip().lower() or DEFAULT_POOL


class _ExpectedHashes:
    """`bundle_config_hash(bundle, pool)`, each computed once per status answer."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._cache: dict[tuple[str, str], str] = {}

    def __call__(self, bundle: str, pool: str) -> str:
        key = (bundle, pool)
        if key not in self._cache:
            self._cache[key] = self._catalog.bundle_config_hash(bundle, pool)
        return self._cache[key]


def worker_ack_status(
    catalog: Catalog, model_id: str, config_epoch: int, healthy: Sequence[WorkerHeartbeat]
) -> dict[str, Any]:
    """The `/v1/configs/models/{id}/status` body; raises ModelNotFoundError for an unknown id.

    Per affected bundle, which healthy workers of exactly that bundle advertise the expected `bundle_config_hash`
    for their pool scope (seed 000 §7). A bundle is acked when it has at least one eligible worker and none
    pending; a model with no routable bundle is never "all acked" (`no_bundles: true`).
    """
    entry = catalog.get(model_id)
    pool = entry.model.effective_pool
    expected = _ExpectedHashes(catalog)
    bundles = [_bundle_status(bundle.name, pool, expected, healthy) for bundle in catalog.model_bundles(entry.model)]
    return {
        "model_id": entry.model_id,
        "config_epoch": config_epoch,
        "all_bundles_acked": bool(bundles) and all(row["acked"] for row in bundles),
        "no_bundles": not bundles,
        "bundles": bundles,
        "source": STATUS_SOURCE,
    }


def _bundle_status(
    bundle: str, pool: str, expected: _ExpectedHashes, healthy: Sequence[WorkerHeartbeat]
) -> dict[str, Any]:
    # Case-sensitive on purpose (§6): a worker whose bundle differs in case is not this bundle's worker.
    eligible = [heartbeat for heartbeat in healthy if heartbeat.bundle == bundle]
    acked = {hb.worker_id for hb in eligible if hb.bundle_config_hash == expected(bundle, pool_scope(hb.pool))}
    pending = {hb.worker_id for hb in eligible} - acked
    return {
        "bundle_id": bundle,
        "pool": pool,
        "expected_bundle_config_hash": expected(bundle, pool),
        "total_eligible_workers": len(eligible),
        "acked_workers": sorted(acked),
        "pending_workers": sorted(pending),
        "acked": bool(eligible) and not pending,
    }
