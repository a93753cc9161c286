"""Role wiring: each role module builds its components from Settings and runs them.

`AVAILABLE_ROLES` maps a role name to its entry function; a role appears here once it is built.
"""

from __future__ import annotations

from collections.abc import Callable

from sie.settings import Settings

RoleMain = Callable[[Settings], int]

AVAILABLE_ROLES: dict[str, RoleMain] = {}
PLANNED_ROLES = ("gateway", "config", "sidecar", "worker", "all")
