"""The config control plane: the config service itself, how gateways and sidecars follow it
(seed 000 §4, §13; seed 001 "Live Config"), and where the baseline catalogue is read from.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from pathlib import Path

import attrs

from sie.settings._parsers import boolean, http_url, integer, path, seconds, string_list, text
from sie.settings._spec import Env, setting

# Processes that hold a catalogue: they route by it, serve it, or load its models.
_CATALOGUE_ROLES = ("gateway", "config", "worker", "all")
_FOLLOWER_ROLES = ("gateway", "sidecar")


def _catalogue_dir(name: str) -> Path:
    # The baseline catalogue is package data (`src/sie/config/`; the repository's `config/` links there), so
    # an editable install, a wheel and the Docker image read the same files from any working directory.
    return Path(str(importlib.resources.files("sie").joinpath("config", name)))


def _bundles_dir(_environ: Mapping[str, str]) -> Path:
    return _catalogue_dir("bundles")


def _models_dir(_environ: Mapping[str, str]) -> Path:
    return _catalogue_dir("models")


@attrs.frozen
class ConfigServiceSettings:
    """The config role (`sie run --role config`): its HTTP server and its persistent store."""

    host: str = setting(
        Env(
            "SIE_CONFIG_HOST",
            text(),
            "Interface the config service binds.",
            flag="--host",
            roles=("config",),
            read_by=("sie.roles.config",),
        ),
        "0.0.0.0",
    )
    port: int = setting(
        Env(
            "SIE_CONFIG_PORT",
            integer(0, 65535),
            "Port of the config service (0 picks a free port).",
            flag="--port",
            roles=("config",),
            read_by=("sie.roles.config",),
        ),
        8081,
    )
    store_dir: str | None = setting(
        Env(
            "SIE_CONFIG_STORE_DIR",
            text(),
            "Config store: local path, `s3://`, `gs://` or `abfs://` (Azure Blob / ADLS Gen2; `abfss://`, `az://` "
            "too) URL holding `models/*.yaml` and `epoch`, with credentials from the backend's usual environment "
            "(AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_CONNECTION_STRING, as SIE_PAYLOAD_STORE_URL). "
            "Unset: nothing persists and the epoch restarts at 0. `all` runs the config service in process and "
            "reads it too.",
            roles=("config", "all"),
            read_by=("sie.roles.config",),
        ),
        None,
    )
    restore: bool = setting(
        Env(
            "SIE_CONFIG_RESTORE",
            boolean(),
            "Replay the stored models at start-up, at the stored epoch, so every acknowledged write survives a "
            "restart. `false` only while the store holds no models: the service refuses to start rather than "
            "serve the stored epoch without them (gateways at that epoch would believe they are current).",
            roles=("config", "all"),
            read_by=("sie.roles.config",),
        ),
        True,
    )


@attrs.frozen
class ConfigSyncSettings:
    """How gateways and sidecars follow the config service: bootstrap, epoch poll and live deltas."""

    service_url: str | None = setting(
        Env(
            "SIE_CONFIG_SERVICE_URL",
            http_url(),
            "Base URL of the config service. Unset: no bootstrap, poll or export reconcile.",
            roles=_FOLLOWER_ROLES,
            read_by=("sie.gateway.config_sync.sync", "sie.sidecar.live_config"),
        ),
        None,
    )
    poll_interval_s: float = setting(
        Env(
            "SIE_CONFIG_POLL_INTERVAL_S",
            seconds(positive=True),
            "Epoch poll period; bounds how stale a gateway or sidecar gets after a lost delta (in `all`, how soon a "
            "deleted model leaves the workers).",
            roles=(*_FOLLOWER_ROLES, "all"),
            read_by=("sie.gateway.config_sync.sync", "sie.sidecar.live_config"),
        ),
        30.0,
    )
    trusted_producers: tuple[str, ...] = setting(
        Env(
            "SIE_NATS_CONFIG_TRUSTED_PRODUCERS",
            string_list(),
            "Producer ids whose config deltas are applied: exact match or pod-name prefix (`name-...`).",
            roles=_FOLLOWER_ROLES,
            read_by=("sie.gateway.config_sync.sync", "sie.sidecar.live_config"),
        ),
        ("sie-config",),
    )
    trust_any_producer: bool = setting(
        Env(
            "SIE_NATS_CONFIG_TRUST_ANY_PRODUCER",
            boolean(),
            "Apply config deltas from any producer (dev only; logged as a warning at start-up).",
            roles=_FOLLOWER_ROLES,
            read_by=("sie.gateway.config_sync.sync", "sie.sidecar.live_config"),
        ),
        False,
    )


@attrs.frozen
class CatalogSettings:
    """The baseline bundles and model configs on disk (the filesystem seed)."""

    bundles_dir: Path = setting(
        Env(
            "SIE_BUNDLES_DIR",
            path(),
            "Directory of bundle YAMLs.",
            shown_default="the package's `config/bundles`",
            roles=_CATALOGUE_ROLES,
            read_by=("sie.roles.serving", "sie.roles.config"),
        ),
        factory=_bundles_dir,
    )
    models_dir: Path = setting(
        Env(
            "SIE_MODELS_DIR",
            path(),
            "Directory of model config YAMLs.",
            shown_default="the package's `config/models`",
            roles=_CATALOGUE_ROLES,
            read_by=("sie.roles.serving", "sie.roles.config"),
        ),
        factory=_models_dir,
    )
