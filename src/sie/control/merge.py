"""Pure checks and merges of the write path (seed 000 §3.3.1–3.3.3): required fields, the append-only merge
with its conflicts, schema validation of the merged document, and routability against the bundles.

No I/O, no locks: `writes.py` calls these in order under its lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sie.catalog import Catalog, CatalogErrors, ModelConfig, parse_model_config
from sie.control.errors import ContentConflictError, ValidationFailedError

PROFILES = "profiles"


@attrs.frozen
class AppendPlan:
    """What an append does: the merged document and which profiles it creates or finds already present."""

    merged: dict[str, Any]
    created: list[str]
    skipped: list[str]


def require_fields(document: Mapping[str, Any]) -> None:
    """422 when the incoming document itself lacks `sie_id` or a non-empty `profiles` mapping."""
    messages = [f"Missing required field: {key}" for key in ("sie_id", PROFILES) if not document.get(key)]
    if not messages and not isinstance(document[PROFILES], Mapping):
        messages.append("Field 'profiles' must be a mapping")
    if messages:
        raise ValidationFailedError(messages)


def _conflicting_fields(existing: Mapping[str, Any], incoming: Mapping[str, Any]) -> list[str]:
    return [key for key, value in incoming.items() if key != PROFILES and key in existing and existing[key] != value]


def plan_append(existing: ModelConfig | None, incoming: Mapping[str, Any]) -> AppendPlan:
    """Merge `incoming` into the existing model: new fields and profiles added, identical ones skipped,
    changed ones refused with 409 content_conflict (profiles first, then metadata)."""
    if existing is None:
        return AppendPlan(dict(incoming), sorted(incoming[PROFILES]), [])
    old = dict(existing.raw)
    old_profiles: Mapping[str, Any] = old.get(PROFILES) or {}
    new_profiles: Mapping[str, Any] = incoming[PROFILES]
    changed = [name for name, body in new_profiles.items() if name in old_profiles and old_profiles[name] != body]
    if changed:
        raise ContentConflictError(existing.sie_id, profiles=changed)
    fields = _conflicting_fields(old, incoming)
    if fields:
        raise ContentConflictError(existing.sie_id, fields=fields)
    merged = {**old, **{key: value for key, value in incoming.items() if key != PROFILES}}
    merged[PROFILES] = {**old_profiles, **new_profiles}
    created = sorted(name for name in new_profiles if name not in old_profiles)
    return AppendPlan(merged, created, sorted(name for name in new_profiles if name in old_profiles))


def parse_checked(document: Mapping[str, Any]) -> ModelConfig:
    """The document as a ModelConfig; every schema problem becomes one 422 detail."""
    try:
        return parse_model_config(document, source="request")
    except CatalogErrors as exc:
        raise ValidationFailedError([error.message for error in exc.errors]) from exc


def profile_bundles(catalog: Catalog, model: ModelConfig, profile: str) -> list[str]:
    """Bundles (lowest priority first) that run one profile, resolved through `extends`."""
    module = model.resolve_profile(profile).adapter_module
    return [bundle.name for bundle in catalog.bundles_by_priority if bundle.runs(module)]


def check_routable(catalog: Catalog, model: ModelConfig, profiles: list[str]) -> dict[str, list[str]]:
    """`{profile: [bundles]}` for `profiles`; 422 when a profile's adapter is in no bundle or the model
    would route nowhere (an extends-only profile can be appended to a routable model)."""
    routable = {name: profile_bundles(catalog, model, name) for name in profiles}
    unknown = sorted(
        {model.resolve_profile(name).adapter_module or "" for name, bundles in routable.items() if not bundles}
    )
    unknown = [module for module in unknown if module]
    if unknown:
        raise ValidationFailedError([f"Adapter(s) not in any known bundle: {', '.join(unknown)}"])
    if not catalog.model_bundles(model):
        raise ValidationFailedError([f"Model '{model.sie_id}' resolves to zero routable bundles"])
    return routable
