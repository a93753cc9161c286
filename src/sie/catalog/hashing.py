"""`bundle_config_hash` and the control-plane fingerprints, byte-identical to SIE 0.10.1.

Rules: contracts Part A §2.3 and seed 000 §7. Every process that must agree on a hash calls these
functions; nothing else in the code base hashes catalogue content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from sie.catalog.bundle import Bundle
from sie.catalog.errors import ConfigError
from sie.catalog.model import ModelConfig


def canonical_adapter_options(options: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Drop empty-map values, then collapse to None when every remaining value is falsy."""
    if not isinstance(options, Mapping):
        return options
    kept = {key: value for key, value in options.items() if not (isinstance(value, Mapping) and not value)}
    return kept if any(kept.values()) else None


def _hashed_profiles(model: ModelConfig, bundle: Bundle) -> list[dict[str, Any]]:
    profiles = []
    for name in sorted(model.profiles):
        try:
            profile = model.resolve_profile(name)
        except ConfigError:
            continue  # an unresolvable extends chain is skipped, as sie-config does
        if not bundle.runs(profile.adapter_module):
            continue
        config = {
            "adapter_path": profile.adapter_path,
            "max_batch_tokens": profile.max_batch_tokens,
            "compute_precision": profile.compute_precision,
            "adapter_options": canonical_adapter_options(profile.adapter_options),
        }
        profiles.append({"name": name, "config": config})
    return profiles


def bundle_config_canonical_json(
    bundle: Bundle, models: Iterable[ModelConfig], pool: str | None = None
) -> bytes | None:
    """The exact bytes bundle_config_hash digests: sorted-key JSON of the routable profiles, or None."""
    items = []
    for model in sorted(models, key=lambda m: m.sie_id):
        if pool is not None and model.effective_pool != pool:
            continue
        profiles = _hashed_profiles(model, bundle)
        if profiles:
            items.append({"sie_id": model.sie_id, "revision": model.hf_revision or None, "profiles": profiles})
    return orjson.dumps(items, option=orjson.OPT_SORT_KEYS) if items else None


def bundle_config_hash(bundle: Bundle, models: Iterable[ModelConfig], pool: str | None = None) -> str:
    """SHA-256 over the bundle's routable profiles of `models` (optionally one pool's), `""` when none."""
    canonical = bundle_config_canonical_json(bundle, models, pool)
    return hashlib.sha256(canonical).hexdigest() if canonical is not None else ""


def _compact_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def bundles_hash(bundles: Iterable[Bundle]) -> str:
    """Fingerprint of the bundle set (name, priority, sorted adapters, engine); `""` when empty."""
    rows = [
        {"name": b.name, "priority": b.priority, "adapters": sorted(b.adapters), "engine": b.engine}
        for b in sorted(bundles, key=lambda b: b.name)
    ]
    return hashlib.sha256(_compact_json(rows)).hexdigest() if rows else ""


def bundle_config_hashes_hash(bundle_hashes: Mapping[str, str], model_pools: Mapping[str, Mapping[str, str]]) -> str:
    """Fingerprint of every bundle's config hash plus which models (and pools) each bundle serves."""
    body = {
        bundle: {"bundle_config_hash": digest, "model_pools": dict(model_pools.get(bundle, {}))}
        for bundle, digest in bundle_hashes.items()
    }
    return hashlib.sha256(_compact_json(body)).hexdigest()
