"""The live config delta sie-config publishes on `sie.config.models.{bundle}` and `._all` (JSON; seed 000 §8.3).

Readers also accept `producer_id`, the name the Rust gateway uses for `router_id`.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class ConfigNotification:
    """One model write as seen by one affected bundle; a write to N bundles sends N of these."""

    # The publisher's pod/host identity (named router_id on the wire for compatibility).
    router_id: str
    bundle_id: str
    epoch: int
    bundle_config_hash: str
    model_id: str
    model_config: str
    pool: str | None = None
    # bundle_id -> pool -> hash: the pool-scoped projection workers acknowledge.
    bundle_pool_config_hashes: dict[str, dict[str, str]] = attrs.Factory(dict)
    profiles_added: list[str] = attrs.Factory(list)
    affected_bundles: list[str] = attrs.Factory(list)
    # Adapter modules of the bundle; 0.10.1 sends it (contracts Part A §2.7), the seed does not list it.
    bundle_adapters: list[str] | None = None
