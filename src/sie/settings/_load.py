"""The composed `Settings` object and `load_settings`, the one place that reads the environment.

Precedence per field: a CLI override (keyed by field path), then the variable, then its aliases,
then the default. Blank values count as unset. Every problem is collected and raised together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from sie.settings._spec import FACTORY_KEY, SPEC_KEY, Env, group
from sie.settings.control import CatalogSettings, ConfigServiceSettings, ConfigSyncSettings
from sie.settings.gateway import AuthSettings, GatewaySettings
from sie.settings.identity import LaneSettings, ProcessSettings
from sie.settings.messaging import NatsSettings, StreamSettings
from sie.settings.payloads import PayloadSettings
from sie.settings.placement import PlacementSettings
from sie.settings.pools import PoolSettings
from sie.settings.sidecar import BatchingSettings, SidecarSettings
from sie.settings.telemetry import TelemetrySettings
from sie.settings.tracing import TracingSettings
from sie.settings.worker import WorkerSettings


@attrs.frozen
class Settings:
    """Every setting of every role, parsed once at start-up; roles hand each component its group."""

    process: ProcessSettings = group(ProcessSettings, "Process")
    lane: LaneSettings = group(LaneSettings, "Lane")
    nats: NatsSettings = group(NatsSettings, "NATS")
    stream: StreamSettings = group(StreamSettings, "JetStream streams and consumers")
    gateway: GatewaySettings = group(GatewaySettings, "Gateway")
    auth: AuthSettings = group(AuthSettings, "Auth")
    pools: PoolSettings = group(PoolSettings, "Pools and scale-from-zero")
    config_service: ConfigServiceSettings = group(ConfigServiceSettings, "Config service")
    config_sync: ConfigSyncSettings = group(ConfigSyncSettings, "Config sync")
    catalog: CatalogSettings = group(CatalogSettings, "Catalogue")
    sidecar: SidecarSettings = group(SidecarSettings, "Sidecar")
    batching: BatchingSettings = group(BatchingSettings, "Batching")
    payloads: PayloadSettings = group(PayloadSettings, "Payload offload")
    worker: WorkerSettings = group(WorkerSettings, "Worker")
    placement: PlacementSettings = group(PlacementSettings, "Placement")
    telemetry: TelemetrySettings = group(TelemetrySettings, "Telemetry")
    tracing: TracingSettings = group(TracingSettings, "Tracing")


# Field types are strings under `from __future__ import annotations`; the loader needs the classes.
attrs.resolve_types(Settings)


class SettingsError(ValueError):
    """One or more settings are invalid; `problems` holds one line per bad variable or flag."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid settings:\n" + "\n".join(f"  - {line}" for line in self.problems))


def format_settings_error(error: SettingsError) -> str:
    """The message the CLI prints before exiting with status 2."""
    return f"sie: {error}\nSee docs/settings.md for every setting, its type and its default."


def _blank_to_none(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    return value.strip()


def _override_text(value: object) -> str:
    # Overrides arrive typed from the CLI; they go through the same parser as the variable.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(_override_text(item) for item in value)
    return str(value)


def _raw_value(
    spec: Env, path: str, environ: Mapping[str, str], overrides: Mapping[str, object]
) -> tuple[str, str] | None:
    """The text to parse and the name it came from, or None when the field keeps its default."""
    if overrides.get(path) is not None:
        text = _blank_to_none(_override_text(overrides[path]))
        return None if text is None else (text, spec.flag or path)
    for name in (spec.name, *spec.aliases):
        text = _blank_to_none(environ.get(name))
        if text is not None:
            return text, name
    return None


def _default(field: attrs.Attribute, environ: Mapping[str, str]) -> Any:
    factory = field.metadata[FACTORY_KEY]
    if factory is not None:
        return factory(environ)
    return field.default


def _load_group(
    group_field: attrs.Attribute,
    environ: Mapping[str, str],
    overrides: Mapping[str, object],
    problems: list[str],
) -> Any:
    values: dict[str, Any] = {}
    failed = False
    for field in attrs.fields(group_field.type):
        spec: Env = field.metadata[SPEC_KEY]
        raw = _raw_value(spec, f"{group_field.name}.{field.name}", environ, overrides)
        if raw is None:
            values[field.name] = _default(field, environ)
            continue
        text, source = raw
        try:
            values[field.name] = spec.parse.convert(text)
        except ValueError as exc:
            shown = "***" if spec.secret else text
            problems.append(f"{source}={shown!r} {exc}")
            failed = True
    return None if failed else group_field.type(**values)


def setting_paths() -> list[str]:
    """Every field path (`group.field`) that `overrides` may name, in declaration order."""
    return [
        f"{group_field.name}.{field.name}"
        for group_field in attrs.fields(Settings)
        for field in attrs.fields(group_field.type)
    ]


def unrecognised_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """`SIE_*` names set in `environ` that no setting reads: likely typos, worth a start-up warning."""
    source = os.environ if environ is None else environ
    known = {
        name
        for group_field in attrs.fields(Settings)
        for field in attrs.fields(group_field.type)
        for name in (field.metadata[SPEC_KEY].name, *field.metadata[SPEC_KEY].aliases)
    }
    return sorted(name for name in source if name.startswith("SIE_") and name not in known)


def load_settings(
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """Parse every setting once: `overrides` (CLI values keyed by field path, None = not given) win over
    `environ` (default: the process environment), which wins over defaults. Raises SettingsError.
    """
    source = os.environ if environ is None else environ
    given = {path: value for path, value in (overrides or {}).items() if value is not None}
    problems = [
        f"unknown setting {path!r}; expected a field path such as 'gateway.port'"
        for path in sorted(set(given) - set(setting_paths()))
    ]
    groups = {field.name: _load_group(field, source, given, problems) for field in attrs.fields(Settings)}
    if problems:
        raise SettingsError(problems)
    return Settings(**groups)
