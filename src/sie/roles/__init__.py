"""Role wiring: each role module builds its components from Settings and runs them (`run(settings)`).

`AVAILABLE_ROLES` maps a role name to its module, imported on use so each role loads only its stack.
"""

from __future__ import annotations

import importlib

from sie.settings import Settings

AVAILABLE_ROLES: dict[str, str] = {
    "all": "sie.roles.all",
    "config": "sie.roles.config",
    "gateway": "sie.roles.gateway",
    "sidecar": "sie.roles.sidecar",
    "worker": "sie.roles.worker",
}
PLANNED_ROLES = ("gateway", "config", "sidecar", "worker", "all")


def run_role(role: str, settings: Settings) -> int:
    """Run a built role to completion; returns the process exit code."""
    return importlib.import_module(AVAILABLE_ROLES[role]).run(settings)
