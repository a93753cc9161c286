"""Pieces a gateway app under test is built with when they are not the test's subject: a ModelStatusSource with
no workers, and the config write routes `sie run --role all` adds (over an in-memory store)."""

from __future__ import annotations

import functools
from pathlib import Path

from starlette.routing import Route

from sie.control.auth import AccessPolicy
from sie.control.http.app import write_routes
from sie.control.http.handlers import ControlHandlers
from sie.control.loading import load_registry
from sie.control.registry import ModelRegistry, RegistryState
from sie.control.writes import ConfigWriter
from sie.stores.fsspec_store import open_config_store

REPO = Path(__file__).resolve().parents[2]


class NoWorkers:
    """Every model available, no worker known."""

    def status(self, model_id: str) -> tuple[str, None]:
        return "available", None

    def workers(self) -> list:
        return []

    def residency(self, model_id: str) -> list:
        return []


@functools.cache
def baseline_state() -> RegistryState:
    """The baseline catalogue's registry state, read once per test process (a state is immutable: writes swap in a
    new one): the tests building a gateway app per case would otherwise parse the YAML files each time."""
    return load_registry(REPO / "config" / "bundles", REPO / "config" / "models").state


def config_write_routes(policy: AccessPolicy | None = None) -> list[Route]:
    """The config service's write routes over the baseline catalogue and an in-memory store, as the `all` role
    serves them beside its gateway."""
    registry = ModelRegistry(baseline_state())
    handlers = ControlHandlers(ConfigWriter(registry, open_config_store(None)), registry, policy or AccessPolicy())
    return write_routes(handlers)
