"""`sie run --role ROLE [--flag value …]`: start one role (or `all` in one process).

Every setting's CLI flag (see README / docs/settings.md) is accepted here and wins over its
environment variable; boolean flags take `--flag` / `--flag=false`.
"""

from __future__ import annotations

import typer

from sie.cli.checks import EnvironmentProblem, check_onnxruntime_builds
from sie.roles import AVAILABLE_ROLES, PLANNED_ROLES, run_role
from sie.settings import SettingsError, describe_settings, load_settings

_FLAG_PATHS = {doc.flag: doc.path for doc in describe_settings() if doc.flag}
_BOOLEAN_FLAGS = {doc.flag for doc in describe_settings() if doc.flag and doc.type == "boolean"}
RUN_HELP = (
    "Run one SIE role. Roles: "
    + ", ".join(PLANNED_ROLES)
    + " (only those built in this version start). Every setting's flag is accepted, e.g. --port 8080, "
    "--preload MODEL[,MODEL], --nats-url URL; see docs/settings.md for the full list."
)


class FlagError(ValueError):
    """A command-line flag that no setting has, or one without its value."""


def parse_flags(arguments: list[str]) -> dict[str, str]:
    """`--flag value`, `--flag=value` and bare boolean `--flag` → `{setting path: text}`."""
    overrides: dict[str, str] = {}
    index = 0
    while index < len(arguments):
        flag, _, value = arguments[index].partition("=")
        if flag not in _FLAG_PATHS:
            raise FlagError(f"unknown option {flag!r}; `sie run --help` lists where the options are documented")
        if not value and "=" not in arguments[index]:
            if flag in _BOOLEAN_FLAGS and (index + 1 == len(arguments) or arguments[index + 1].startswith("--")):
                value = "true"
            elif index + 1 < len(arguments):
                index += 1
                value = arguments[index]
            else:
                raise FlagError(f"option {flag} needs a value")
        overrides[_FLAG_PATHS[flag]] = value
        index += 1
    return overrides


def run(ctx: typer.Context) -> None:
    """Run one SIE role."""
    try:
        check_onnxruntime_builds()
        settings = load_settings(overrides=parse_flags(list(ctx.args)))
    except (EnvironmentProblem, SettingsError, FlagError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if settings.process.role not in AVAILABLE_ROLES:
        available = ", ".join(sorted(AVAILABLE_ROLES)) or "none yet"
        typer.echo(
            f"error: role '{settings.process.role}' is not available in this version; available roles: {available}",
            err=True,
        )
        raise typer.Exit(2)
    raise typer.Exit(run_role(settings.process.role, settings))
