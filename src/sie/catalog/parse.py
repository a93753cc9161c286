"""Turn YAML mappings into ModelConfig and Bundle objects, reporting every bad field with its location.

The rules are contracts Part B §3.1–3.2 and Part A §2.4: required fields, id rules, one level of
`extends`, profile field types, and the artifact-source rule. Unknown fields are kept, not rejected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sie.catalog.bundle import Bundle
from sie.catalog.errors import CatalogErrors, ConfigError, InvalidModelIdError
from sie.catalog.ids import is_valid_pool_name, validate_model_id
from sie.catalog.model import (
    COMPUTE_PRECISIONS,
    ENCODE_OUTPUTS,
    ModelConfig,
    PackageSource,
    Profile,
    Tasks,
)

ADAPTER_PATH_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MODEL_FIELDS = frozenset(
    {
        "sie_id", "profiles", "hf_id", "hf_revision", "weights_path", "package", "package_backed",
        "inputs", "tasks", "max_sequence_length", "pool",
    }
)  # fmt: skip
_PROFILE_FIELDS = frozenset({"extends", "adapter_path", "max_batch_tokens", "compute_precision", "adapter_options"})
_BUNDLE_FIELDS = frozenset({"name", "priority", "adapters", "engine"})
DEFAULT_BUNDLE_PRIORITY = 100
DEFAULT_ENGINE = "pytorch"


class _Issues:
    """Collects ConfigErrors for one source so a file reports all its problems at once."""

    def __init__(self, source: str, model_id: str | None = None) -> None:
        self.source = source
        self.model_id = model_id
        self.errors: list[ConfigError] = []

    def add(self, field: str | None, message: str) -> None:
        self.errors.append(ConfigError(message, source=self.source, model_id=self.model_id, field=field))

    def has(self, field: str) -> bool:
        return any(error.field == field for error in self.errors)

    def raise_if_any(self) -> None:
        if self.errors:
            raise CatalogErrors(self.errors)


def _field_type_error(issues: _Issues, field: str, label: str, value: Any) -> None:
    issues.add(field, f"expected {label}, got {type(value).__name__} {value!r}")


def _positive_int(issues: _Issues, field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _field_type_error(issues, field, "a positive integer", value)
        return None
    return value


def _optional_str(issues: _Issues, field: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    _field_type_error(issues, field, "a string", value)
    return None


def _mapping(issues: _Issues, field: str, value: Any) -> Mapping[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return value
    _field_type_error(issues, field, "a mapping", value)
    return None


def parse_model_config(data: Any, source: str = "<model>") -> ModelConfig:
    """Build a ModelConfig from one parsed YAML document; raises CatalogErrors listing every problem."""
    if not isinstance(data, Mapping):
        raise CatalogErrors([ConfigError("Expected YAML mapping at top level", source=source)])
    sie_id = data.get("sie_id")
    issues = _Issues(source, sie_id if isinstance(sie_id, str) else None)
    if not isinstance(sie_id, str) or not sie_id:
        issues.add("sie_id", "Missing required field: sie_id")
    else:
        try:
            validate_model_id(sie_id)
        except InvalidModelIdError as exc:
            issues.add("sie_id", exc.message)
    profiles = _parse_profiles(issues, data.get("profiles"))
    config = ModelConfig(
        sie_id=sie_id if isinstance(sie_id, str) else "",
        profiles=profiles,
        hf_id=_optional_str(issues, "hf_id", data.get("hf_id")),
        hf_revision=_optional_str(issues, "hf_revision", data.get("hf_revision")),
        weights_path=_optional_str(issues, "weights_path", data.get("weights_path")),
        package=_parse_package(issues, data.get("package")),
        package_backed=_parse_bool(issues, "package_backed", data.get("package_backed")),
        inputs=_parse_inputs(issues, data.get("inputs")),
        tasks=_parse_tasks(issues, data.get("tasks")),
        max_sequence_length=_positive_int(issues, "max_sequence_length", data.get("max_sequence_length")),
        pool=_parse_pool(issues, data.get("pool")),
        extra={key: value for key, value in data.items() if key not in _MODEL_FIELDS},
        raw=dict(data),
    )
    _check_sources(issues, config)
    _check_extends(issues, config)
    issues.raise_if_any()
    return config


def _parse_bool(issues: _Issues, field: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        _field_type_error(issues, field, "true or false", value)
        return False
    return value


def _parse_pool(issues: _Issues, value: Any) -> str | None:
    pool = _optional_str(issues, "pool", value)
    if pool and not is_valid_pool_name(pool.strip()):
        issues.add("pool", f"invalid pool name {pool!r}: use [A-Za-z0-9_-]{{1,128}}, not '_default'")
    return pool


def _parse_package(issues: _Issues, value: Any) -> PackageSource | None:
    package = _mapping(issues, "package", value)
    if package is None:
        return None
    fields = {}
    for key in ("distribution", "version", "path"):
        item = package.get(key)
        if not isinstance(item, str) or not item:
            issues.add(f"package.{key}", "Missing required field: a non-empty string")
        fields[key] = item if isinstance(item, str) else ""
    return PackageSource(**fields)


def _parse_inputs(issues: _Issues, value: Any) -> dict[str, bool]:
    inputs = _mapping(issues, "inputs", value)
    if inputs is None:
        return {"text": True}
    parsed = {}
    for key, flag in inputs.items():
        if not isinstance(flag, bool):
            _field_type_error(issues, f"inputs.{key}", "true or false", flag)
            continue
        parsed[str(key)] = flag
    parsed.setdefault("text", True)
    return parsed


def _parse_tasks(issues: _Issues, value: Any) -> Tasks:
    tasks = _mapping(issues, "tasks", value) or {}
    encode = _mapping(issues, "tasks.encode", tasks.get("encode")) or {}
    outputs: dict[str, int | None] = {}
    matryoshka = False
    for kind, block in encode.items():
        if kind not in ENCODE_OUTPUTS:
            issues.add(f"tasks.encode.{kind}", f"unknown output type; expected one of {list(ENCODE_OUTPUTS)}")
            continue
        block = _mapping(issues, f"tasks.encode.{kind}", block)
        if block is not None:
            outputs[kind] = _positive_int(issues, f"tasks.encode.{kind}.dim", block.get("dim"))
            if kind == "dense":
                matryoshka = _parse_bool(issues, "tasks.encode.dense.matryoshka", block.get("matryoshka"))
    generate = _mapping(issues, "tasks.generate", tasks.get("generate")) or {}
    return Tasks(
        encode=outputs,
        matryoshka=matryoshka,
        score=tasks.get("score") is not None,
        extract=tasks.get("extract") is not None,
        generate=tasks.get("generate") is not None,
        max_output_tokens=_positive_int(issues, "tasks.generate.max_output_tokens", generate.get("max_output_tokens")),
    )


def _parse_profiles(issues: _Issues, value: Any) -> dict[str, Profile]:
    if value is None:
        issues.add("profiles", "Missing required field: profiles")
        return {}
    profiles = _mapping(issues, "profiles", value)
    if profiles is None:
        return {}
    if not profiles:
        issues.add("profiles", "must define at least one profile")
    return {str(name): _parse_profile(issues, str(name), body) for name, body in profiles.items()}


def _parse_profile(issues: _Issues, name: str, body: Any) -> Profile:
    prefix = f"profiles.{name}"
    body = _mapping(issues, prefix, body) or {}
    adapter_path = _optional_str(issues, f"{prefix}.adapter_path", body.get("adapter_path"))
    if adapter_path is not None and not ADAPTER_PATH_PATTERN.match(adapter_path):
        issues.add(f"{prefix}.adapter_path", f"expected 'module.path:ClassName', got {adapter_path!r}")
    precision = body.get("compute_precision")
    if precision is not None and precision not in COMPUTE_PRECISIONS:
        issues.add(f"{prefix}.compute_precision", f"expected one of {sorted(COMPUTE_PRECISIONS)} or null")
        precision = None
    return Profile(
        name=name,
        extends=_optional_str(issues, f"{prefix}.extends", body.get("extends")),
        adapter_path=adapter_path,
        max_batch_tokens=_positive_int(issues, f"{prefix}.max_batch_tokens", body.get("max_batch_tokens")),
        compute_precision=precision,
        adapter_options=_parse_adapter_options(issues, prefix, body.get("adapter_options")),
        extra={key: value for key, value in body.items() if key not in _PROFILE_FIELDS},
    )


def _parse_adapter_options(issues: _Issues, prefix: str, value: Any) -> Mapping[str, Any] | None:
    options = _mapping(issues, f"{prefix}.adapter_options", value)
    if options is None:
        return None
    for group in ("loadtime", "runtime"):
        _mapping(issues, f"{prefix}.adapter_options.{group}", options.get(group))
    return dict(options)


def _check_sources(issues: _Issues, config: ModelConfig) -> None:
    named = [key for key in ("hf_id", "weights_path", "hf_revision", "package") if getattr(config, key)]
    if config.package_backed and named:
        issues.add("package_backed", f"must not be combined with {', '.join(named)}")
    elif not config.package_backed and not (config.hf_id or config.weights_path or config.package):
        issues.add("hf_id", "one of hf_id, weights_path or package is required (or package_backed: true)")


def _check_extends(issues: _Issues, config: ModelConfig) -> None:
    for name, profile in config.profiles.items():
        field = f"profiles.{name}"
        if profile.extends is None:
            for required in ("adapter_path", "max_batch_tokens"):
                if getattr(profile, required) is None and not issues.has(f"{field}.{required}"):
                    issues.add(f"{field}.{required}", f"Missing required field: {required} (profile has no extends)")
            continue
        parent = config.profiles.get(profile.extends)
        if parent is None:
            issues.add(f"{field}.extends", f"extends unknown profile '{profile.extends}'")
        elif parent.extends is not None:
            issues.add(
                f"{field}.extends",
                f"'{profile.extends}' itself extends '{parent.extends}'; only one level of extends is allowed",
            )


def parse_bundle(data: Any, source: str = "<bundle>") -> Bundle:
    """Build a Bundle from one parsed YAML document; raises CatalogErrors listing every problem."""
    if not isinstance(data, Mapping):
        raise CatalogErrors([ConfigError("Expected YAML mapping at top level", source=source)])
    issues = _Issues(source)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        issues.add("name", "Missing required field: name")
    priority = data.get("priority", DEFAULT_BUNDLE_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int):
        _field_type_error(issues, "priority", "an integer", priority)
        priority = DEFAULT_BUNDLE_PRIORITY
    adapters = data.get("adapters")
    if not isinstance(adapters, list) or not all(isinstance(item, str) and item for item in adapters):
        issues.add("adapters", "expected a list of adapter module names")
        adapters = []
    engine = data.get("engine") or DEFAULT_ENGINE
    if not isinstance(engine, str):
        _field_type_error(issues, "engine", "a string", engine)
        engine = DEFAULT_ENGINE
    issues.raise_if_any()
    return Bundle(
        name=name,
        priority=priority,
        adapters=tuple(adapters),
        engine=engine,
        extra={key: value for key, value in data.items() if key not in _BUNDLE_FIELDS},
        raw=dict(data),
    )
