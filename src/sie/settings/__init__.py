"""Every SIE_* environment variable and CLI flag, parsed once into frozen attrs objects.

This package is the only code that reads `os.environ`; everything else receives `Settings` or one of
its groups. It imports nothing else from `sie`.
"""

from sie.settings._docs import (
    GroupDoc,
    SettingDoc,
    describe_groups,
    describe_settings,
    render_settings_markdown,
)
from sie.settings._environment import child_environment, huge_pages_environment, wants_huge_pages
from sie.settings._load import (
    Settings,
    SettingsError,
    format_settings_error,
    load_settings,
    setting_paths,
    unrecognised_variables,
)
from sie.settings._roles import (
    flag_paths,
    ignored_variables,
    ignored_variables_note,
    load_role_settings,
    parse_flags,
    requested_role,
)
from sie.settings._spec import ROLES
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

__all__ = [
    "AuthSettings",
    "BatchingSettings",
    "CatalogSettings",
    "ConfigServiceSettings",
    "ConfigSyncSettings",
    "GatewaySettings",
    "GroupDoc",
    "LaneSettings",
    "NatsSettings",
    "PayloadSettings",
    "PlacementSettings",
    "PoolSettings",
    "ProcessSettings",
    "SettingDoc",
    "Settings",
    "SettingsError",
    "SidecarSettings",
    "StreamSettings",
    "TelemetrySettings",
    "TracingSettings",
    "WorkerSettings",
    "child_environment",
    "huge_pages_environment",
    "wants_huge_pages",
    "describe_groups",
    "describe_settings",
    "format_settings_error",
    "load_settings",
    "ROLES",
    "flag_paths",
    "ignored_variables",
    "ignored_variables_note",
    "load_role_settings",
    "parse_flags",
    "render_settings_markdown",
    "requested_role",
    "setting_paths",
    "unrecognised_variables",
]
