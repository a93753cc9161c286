"""The placement policy: seed 002's `scheduling:` block as one immutable value (mode, work basis, repack
budgets, EMA halflife, hysteresis, replicas, fill quantum, routing policy, memory fit) with per-model
overrides. Changed at run time only through validated copies; built at startup from the settings and the
optional placement file. Imports nothing of SIE but the settings and the catalogue's bounded YAML loader.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from sie.catalog.errors import ConfigError
from sie.catalog.yamlio import load_yaml
from sie.settings.placement import PlacementSettings

ROUND_ROBIN: Final = "round_robin"
LEAST_OUTSTANDING: Final = "least_outstanding"
LPT_PACKING: Final = "lpt_packing"
MODES: Final = (ROUND_ROBIN, LEAST_OUTSTANDING, LPT_PACKING)

WORK_BASES: Final = ("compute", "items", "requests")
FILL_MODES: Final = ("run", "spread", "inflight")
ROUTING_POLICIES: Final = ("fill_least", "fill_rr")
COMPACTION_EAGER: Final = "eager"
COMPACTION_SCHEDULED: Final = "scheduled"
COMPACTION_OFF: Final = "off"
COMPACTION_MODES: Final = (COMPACTION_EAGER, COMPACTION_SCHEDULED, COMPACTION_OFF)
ALL_REPLICAS: Final = "all"
# Per-model overrides one policy holds: bounds what the admin API may grow (model ids are not checked there).
MAX_MODEL_OVERRIDES: Final = 4096
MAX_MODEL_ID_CHARS: Final = 512

# Knobs with a fixed set of values, and number knobs with whether 0 is allowed.
_CHOICES: Final = {
    "mode": MODES,
    "work_basis": WORK_BASES,
    "routing_policy": ROUTING_POLICIES,
    "routing_fill_mode": FILL_MODES,
    "compaction_mode": COMPACTION_MODES,
}
_NUMBERS_ALLOWING_ZERO: Final = {
    "rebalance_compute_seconds": False,
    "first_rebalance_compute_seconds": True,
    "ema_halflife_compute_seconds": True,
    "hysteresis": True,
    "routing_fill_factor": False,
}
_BOOLEANS: Final = {
    **dict.fromkeys(("true", "1", "yes", "on"), True),
    **dict.fromkeys(("false", "0", "no", "off"), False),
}
_OVERRIDE_KEYS: Final = ("replicas", "fill_mode", "fill_factor")
# Ceilings that keep every value the policy holds reportable (JSON integers are 64-bit): no fleet has a million
# children, and a fill quantum (max batch x factor) stays far below 2**63.
MAX_REPLICAS: Final = 1_000_000
MAX_FILL_FACTOR: Final = 1_000_000.0
MAX_COMPACTION_INTERVAL: Final = 1_000_000
_CEILINGS: Final = {"routing_fill_factor": MAX_FILL_FACTOR, "fill_factor": MAX_FILL_FACTOR}


class PolicyError(ValueError):
    """A knob name or value the policy refuses; the message says which and what is accepted."""


@attrs.frozen
class ModelOverride:
    """Per-model overrides of the fleet-wide replicas, fill mode and fill factor (None = the default)."""

    replicas: int | str | None = None
    fill_mode: str | None = None
    fill_factor: float | None = None

    def as_dict(self) -> dict[str, object]:
        """The overrides that are set, JSON-ready."""
        return {key: getattr(self, key) for key in _OVERRIDE_KEYS if getattr(self, key) is not None}


@attrs.frozen
class PlacementPolicy:
    """Seed 002's `scheduling:` block. `default_replicas` and `ModelOverride.replicas` are a positive int or
    `all`. `ema_halflife_compute_seconds` 0 tracks `rebalance_compute_seconds`; `first_rebalance_compute_seconds`
    0 uses `rebalance_compute_seconds` for the first repack too. `compaction_mode` says how models are unloaded
    from children a repack took their replicas off (every `compaction_interval` repacks; 0 never)."""

    mode: str = ROUND_ROBIN
    work_basis: str = "compute"
    rebalance_compute_seconds: float = 300.0
    first_rebalance_compute_seconds: float = 60.0
    ema_halflife_compute_seconds: float = 0.0
    hysteresis: float = 0.0
    default_replicas: int | str = 1
    routing_fill_factor: float = 1.0
    routing_policy: str = "fill_least"
    routing_fill_mode: str = "run"
    forbid_memory_oversubscription: bool = True
    compaction_mode: str = COMPACTION_EAGER
    compaction_interval: int = 1
    models: Mapping[str, ModelOverride] = attrs.field(factory=dict)

    def with_knobs(self, knobs: Mapping[str, object]) -> PlacementPolicy:
        """A copy with the given knobs changed (`sie placement set-policy KEY=VALUE`, seed 002 "Runtime
        scheduling control"). Strings are coerced ("0.15", "true", "all"); the mode, per-model settings, and
        the work basis under least_outstanding are fixed at startup."""
        changes: dict[str, object] = {}
        for name, value in knobs.items():
            if name == "mode":
                raise PolicyError(f"mode is fixed at startup (it is {self.mode}); set SIE_PLACEMENT_MODE and restart")
            if name == "models":
                raise PolicyError("models are changed one at a time (replicas, fill_mode, fill_factor of one model)")
            if name == "work_basis" and self.mode == LEAST_OUTSTANDING:
                raise PolicyError(
                    "work_basis is fixed at startup under least_outstanding; set SIE_PLACEMENT_WORK_BASIS and restart"
                )
            changes[name] = coerce_knob(name, value)
        return attrs.evolve(self, **changes)

    def with_model(
        self,
        model_id: str,
        replicas: object = None,
        fill_mode: object = None,
        fill_factor: object = None,
    ) -> PlacementPolicy:
        """A copy with one model's overrides changed; None keeps that override as it is."""
        if not isinstance(model_id, str) or not model_id or len(model_id) > MAX_MODEL_ID_CHARS:
            raise PolicyError(f"model id must be a non-empty string of at most {MAX_MODEL_ID_CHARS} characters")
        if model_id not in self.models and len(self.models) >= MAX_MODEL_OVERRIDES:
            raise PolicyError(f"the policy already holds {MAX_MODEL_OVERRIDES} per-model overrides")
        current = self.models.get(model_id, ModelOverride())
        override = ModelOverride(
            replicas=current.replicas if replicas is None else _replicas("replicas", replicas),
            fill_mode=current.fill_mode if fill_mode is None else _choice("fill_mode", fill_mode, FILL_MODES),
            fill_factor=current.fill_factor if fill_factor is None else _number("fill_factor", fill_factor, False),
        )
        return attrs.evolve(self, models={**self.models, model_id: override})

    def replicas_for(self, model_id: str) -> int | str:
        """How many children the model should be placed on: a positive int or `all`."""
        override = self.models.get(model_id)
        if override is None or override.replicas is None:
            return self.default_replicas
        return override.replicas

    def fill_mode_for(self, model_id: str) -> str:
        """What the model's fill quantum counts: `run`, `spread` or `inflight`."""
        override = self.models.get(model_id)
        if override is None or override.fill_mode is None:
            return self.routing_fill_mode
        return override.fill_mode

    def fill_factor_for(self, model_id: str) -> float:
        """The model's fill quantum as a multiple of its max batch."""
        override = self.models.get(model_id)
        if override is None or override.fill_factor is None:
            return self.routing_fill_factor
        return override.fill_factor

    def as_dict(self) -> dict[str, object]:
        """Every knob and per-model override, JSON-ready, keyed as in the `scheduling:` block."""
        knobs: dict[str, object] = {
            field.name: getattr(self, field.name) for field in attrs.fields(PlacementPolicy) if field.name != "models"
        }
        knobs["models"] = {model_id: self.models[model_id].as_dict() for model_id in sorted(self.models)}
        return knobs


def knob_names() -> tuple[str, ...]:
    """The names `with_knobs` and the placement file accept (every policy field but `models`)."""
    return tuple(field.name for field in attrs.fields(PlacementPolicy) if field.name != "models")


def coerce_knob(name: str, value: object) -> object:
    """One knob's value checked and converted to its type; PolicyError names the knob and what it accepts."""
    if name in _CHOICES:
        return _choice(name, value, _CHOICES[name])
    if name in _NUMBERS_ALLOWING_ZERO:
        return _number(name, value, _NUMBERS_ALLOWING_ZERO[name])
    if name == "default_replicas":
        return _replicas(name, value)
    if name == "forbid_memory_oversubscription":
        return _boolean(name, value)
    if name == "compaction_interval":
        return _count(name, value)
    raise PolicyError(f"unknown scheduling knob {name!r}; accepted: {', '.join(knob_names())}")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if isinstance(value, str) and value.strip() in choices:
        return value.strip()
    raise PolicyError(f"{name}={value!r} is not one of {', '.join(choices)}")


def _number(name: str, value: object, allow_zero: bool) -> float:
    ceiling = _CEILINGS.get(name, math.inf)
    bound = (">= 0" if allow_zero else "> 0") + (f" and <= {ceiling:g}" if ceiling < math.inf else "")
    number = math.nan
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with contextlib.suppress(ValueError, OverflowError):  # OverflowError: an int past the float range
            number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero) or number > ceiling:
        raise PolicyError(f"{name}={value!r} is not a number {bound}")
    return number


def _replicas(name: str, value: object) -> int | str:
    if isinstance(value, str) and value.strip().lower() == ALL_REPLICAS:
        return ALL_REPLICAS
    count = 0
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    elif isinstance(value, str) and value.strip().isdecimal():  # isdigit() would pass '²', which int() refuses
        count = int(value.strip())
    if not 1 <= count <= MAX_REPLICAS:
        raise PolicyError(
            f"{name}={value!r} is not a replica count; expected a whole number from 1 to {MAX_REPLICAS} or 'all'"
        )
    return count


def _count(name: str, value: object) -> int:
    count = -1
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    elif isinstance(value, str) and value.strip().isdecimal():
        count = int(value.strip())
    if not 0 <= count <= MAX_COMPACTION_INTERVAL:
        raise PolicyError(f"{name}={value!r} is not a whole number from 0 to {MAX_COMPACTION_INTERVAL}")
    return count


def _boolean(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
        return _BOOLEANS[value.strip().lower()]
    raise PolicyError(f"{name}={value!r} is not a boolean; expected true/false, 1/0 or yes/no")


def policy_from_settings(settings: PlacementSettings) -> PlacementPolicy:
    """The startup policy: the SIE_PLACEMENT_* values, and the `scheduling:` block of SIE_PLACEMENT_FILE.

    A setting left at its default yields to the file; a setting given a non-default value wins over the
    file. (Settings cannot tell "given as the default" from "not given", so set a knob in one place only.)
    Per-model overrides come from the file alone.
    """
    given = _knobs_of(settings)
    defaults = _knobs_of(PlacementSettings())
    from_file: dict[str, object] = {}
    models: dict[str, ModelOverride] = {}
    if settings.file is not None:
        from_file, models = read_policy_file(settings.file)
    knobs = {name: value if value != defaults[name] else from_file.get(name, value) for name, value in given.items()}
    checked = {name: coerce_knob(name, value) for name, value in knobs.items()}
    return PlacementPolicy(**checked, models=models)


def _knobs_of(settings: PlacementSettings) -> dict[str, object]:
    """The settings under their `scheduling:` names (the variables drop the `routing_` prefix)."""
    return {
        "mode": settings.mode,
        "work_basis": settings.work_basis,
        "rebalance_compute_seconds": settings.rebalance_compute_seconds,
        "first_rebalance_compute_seconds": settings.first_rebalance_compute_seconds,
        "ema_halflife_compute_seconds": settings.ema_halflife_compute_seconds,
        "hysteresis": settings.hysteresis,
        "default_replicas": settings.default_replicas,
        "routing_fill_factor": settings.fill_factor,
        "routing_policy": settings.routing_policy,
        "routing_fill_mode": settings.fill_mode,
        "forbid_memory_oversubscription": settings.forbid_memory_oversubscription,
        "compaction_mode": settings.compaction_mode,
        "compaction_interval": settings.compaction_interval,
    }


def read_policy_file(path: Path) -> tuple[dict[str, object], dict[str, ModelOverride]]:
    """The knobs and per-model overrides of a placement file (see `parse_scheduling_yaml`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(
            f"SIE_PLACEMENT_FILE={path}: cannot be read ({exc.strerror}); fix the path or unset it"
        ) from exc
    return parse_scheduling_yaml(text, source=f"SIE_PLACEMENT_FILE={path}")


def parse_scheduling_yaml(text: str, source: str = "<yaml>") -> tuple[dict[str, object], dict[str, ModelOverride]]:
    """A seed 002 `scheduling:` block, or just its content, as checked knobs plus per-model overrides.

    Keys are the policy's field names (`routing_fill_factor`, `routing_fill_mode`, ...) and `models:
    {MODEL: {replicas, fill_mode, fill_factor}}`; an unknown key is a PolicyError naming it.
    """
    try:
        data = load_yaml(text, source)
    except ConfigError as exc:  # "Invalid YAML: ..." or "Refused YAML: ...", after the source
        raise PolicyError(f"{source}: {exc.message[:1].lower()}{exc.message[1:]}") from exc
    block = _scheduling_block(data, source)
    knobs: dict[str, object] = {}
    models: dict[str, ModelOverride] = {}
    for key, value in block.items():
        try:
            if key == "models":
                models = _parse_models(value)
            else:
                knobs[key] = coerce_knob(str(key), value)
        except PolicyError as exc:
            raise PolicyError(f"{source}: {exc}") from None
    return knobs, models


def _scheduling_block(data: object, source: str) -> Mapping[str, object]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise PolicyError(f"{source}: expected a mapping with a `scheduling:` block")
    if "scheduling" not in data:
        return data
    others = sorted(str(key) for key in data if key != "scheduling")
    if others:
        raise PolicyError(f"{source}: unknown top-level key {others[0]!r}; the file holds one `scheduling:` block")
    block = data["scheduling"] or {}
    if not isinstance(block, Mapping):
        raise PolicyError(f"{source}: `scheduling:` must be a mapping of knobs")
    return block


def _parse_models(value: object) -> dict[str, ModelOverride]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError("models must map model ids to {replicas, fill_mode, fill_factor}")
    policy = PlacementPolicy()
    for model_id, override in value.items():
        override = override or {}
        if not isinstance(override, Mapping):
            raise PolicyError(f"models.{model_id} must be a mapping of {', '.join(_OVERRIDE_KEYS)}")
        unknown = sorted(str(key) for key in override if key not in _OVERRIDE_KEYS)
        if unknown:
            raise PolicyError(f"unknown key {unknown[0]!r} in models.{model_id}; accepted: {', '.join(_OVERRIDE_KEYS)}")
        policy = policy.with_model(str(model_id), **override)
    return dict(policy.models)
