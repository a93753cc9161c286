"""Worker-ack status of one model (seed 000 §6): per affected bundle, which healthy workers of exactly that
bundle advertise the expected `bundle_config_hash` for their pool scope (seed 000 §7). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from sie.catalog import Catalog
from sie.catalog.model import DEFAULT_POOL
from sie.wire.health import WorkerHeartbeat

STATUS_SOURCE: Final = "gateway-registry"

# The latest heartbeat of every *healthy* worker this gateway knows (WorkerRegistry.healthy_workers).
HeartbeatSource = Callable[[], Sequence[WorkerHeartbeat]]


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

    A bundle is acked when it has at least one eligible worker and none pending; a model with no routable
    bundle is never "all acked" (`no_bundles: true`).
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
