"""`sie run --role ROLE`: start one role (or `all` of them in one process) with settings from env and flags."""

from __future__ import annotations

from typing import Annotated

import typer

from sie.cli.checks import EnvironmentProblem, check_onnxruntime_builds
from sie.roles import AVAILABLE_ROLES, PLANNED_ROLES
from sie.settings import SettingsError, load_settings


def _available() -> str:
    return ", ".join(sorted(AVAILABLE_ROLES)) or "none yet"


RoleOption = Annotated[
    str,
    typer.Option("--role", help=f"Which role to run: one of {', '.join(PLANNED_ROLES)} (only those built here start)."),
]


def run(role: RoleOption) -> None:
    """Run one SIE role."""
    try:
        check_onnxruntime_builds()
        settings = load_settings()
    except (EnvironmentProblem, SettingsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    entry = AVAILABLE_ROLES.get(role)
    if entry is None:
        typer.echo(
            f"error: role '{role}' is not available in this version; available roles: {_available()}",
            err=True,
        )
        raise typer.Exit(2)
    raise typer.Exit(entry(settings))
