"""Bodies of the gateway's config read routes (seed 000 §5), built from the registry view; pure, no HTTP.

`ConfigView` is what the routes read: ConfigState in the gateway role, `StaticConfigView` over a plain
catalog getter where nothing syncs (`--role all`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from sie.catalog import Catalog, dump_yaml
from sie.catalog.errors import ModelNotFoundError
from sie.gateway.config_sync.state import ConfigEpoch, ModelSource
from sie.gateway.errors import GatewayError, InvalidRequestError
from sie.wire.health import WorkerHeartbeat

STATUS_SUFFIX = "/status"


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
