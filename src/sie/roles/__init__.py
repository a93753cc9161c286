"""Role wiring: each role module builds its components from Settings and runs them (`run(settings)`).

`ROLE_MODULES` maps a role name to its module, imported on use so each role loads only its stack.
"""

from __future__ import annotations

import importlib

from sie.settings import Settings

ROLE_MODULES: dict[str, str] = {
    "all": "sie.roles.all",
    "config": "sie.roles.config",
    "gateway": "sie.roles.gateway",
    "sidecar": "sie.roles.sidecar",
    "worker": "sie.roles.worker",
}


def run_role(role: str, settings: Settings) -> int:
    """Run a role to completion; returns the process exit code."""
    return importlib.import_module(ROLE_MODULES[role]).run(settings)
