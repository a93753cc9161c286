"""Role wiring: each role module builds its components from Settings and runs them.

`AVAILABLE_ROLES` maps a role name to its entry function; a role appears here once it is built.
"""

from __future__ import annotations

from collections.abc import Callable

from sie.settings import Settings

RoleMain = Callable[[Settings], int]


def _all(settings: Settings) -> int:
    from sie.roles import all as role_all  # imported on use: each role pulls in only its own stack

    return role_all.run(settings)


AVAILABLE_ROLES: dict[str, RoleMain] = {"all": _all}
PLANNED_ROLES = ("gateway", "config", "sidecar", "worker", "all")
