"""`sie run --role ROLE [--flag value …]`: start one role (or `all` in one process).

The role's flags win over its environment variables (docs/settings.md lists both, with the roles that read
each); boolean flags take `--flag` / `--flag=false`. A flag or `SIE_*` variable the role does not read is
refused with exit status 2, never ignored.
"""

from __future__ import annotations

import typer

from sie.cli.checks import EnvironmentProblem, check_onnxruntime_builds
from sie.roles import run_role
from sie.settings import ROLES, SettingsError, load_role_settings

RUN_HELP = (
    "Run one SIE role: "
    + ", ".join(ROLES)
    + " (`all` runs gateway, sidecar and worker in one process). Each role takes its own flags, e.g. "
    "--host/--port for its HTTP listener, --preload MODEL[,MODEL], --nats-url URL; docs/settings.md lists "
    "every flag and variable with the roles that read it. Anything a role does not read is refused."
)


def run(ctx: typer.Context) -> None:
    """Run one SIE role."""
    try:
        check_onnxruntime_builds()
        settings = load_role_settings(list(ctx.args))
    except (EnvironmentProblem, SettingsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    raise typer.Exit(run_role(settings.process.role, settings))
