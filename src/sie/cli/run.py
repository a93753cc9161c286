"""`sie run --role ROLE [--flag value …]`: start one role (or `all` in one process).

The role's flags win over its environment variables (docs/settings.md lists both, with the roles that read
each); boolean flags take `--flag` / `--flag=false`. A flag the role does not read is refused with exit
status 2, and so is an `SIE_*` variable that is no setting (a typo); `SIE_*` variables of other roles are ignored and
named in one start-up log line. Where SIE_MALLOC_HUGE_PAGES asks for huge pages (by default, the worker role) on
glibc, the command re-executes itself once, before the role starts, with malloc's huge-page tunable in GLIBC_TUNABLES
(glibc reads it only at start).
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Final

import typer

from sie.cli.checks import EnvironmentProblem, check_onnxruntime_builds
from sie.cli.run_help import render_run_help
from sie.roles import run_role
from sie.settings import (
    ROLES,
    SettingsError,
    huge_pages_environment,
    load_role_settings,
    requested_role,
    wants_huge_pages,
)

RUN_HELP = (
    "Run one SIE role: "
    + ", ".join(ROLES)
    + " (`all` runs gateway, sidecar and worker in one process). `sie run --help` lists every flag with the "
    "roles that read it, `sie run --role ROLE --help` one role's. A flag a role does not read is refused."
)
HELP_FLAGS = ("--help", "-h")
# The context object `sie`'s own entry point (`sie.cli.main.main`) passes: only a process started as the command
# re-executes itself for huge pages; the command invoked in another program (the tests' CliRunner) never replaces
# its caller's process.
COMMAND_PROCESS: Final = "sie-command-process"


def run(ctx: typer.Context) -> None:
    """Run one SIE role."""
    if any(argument in HELP_FLAGS for argument in ctx.args):
        _print_help(list(ctx.args))
    try:
        check_onnxruntime_builds()
        settings = load_role_settings(list(ctx.args))
    except (EnvironmentProblem, SettingsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if wants_huge_pages(settings.process.malloc_huge_pages, settings.process.role) and ctx.obj == COMMAND_PROCESS:
        environment = huge_pages_environment(platform.libc_ver()[0])
        if environment is not None:  # the same command line, the same process id, the tunable read at its start
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, sys.orig_argv, environment)
    raise typer.Exit(run_role(settings.process.role, settings))


def _print_help(arguments: list[str]) -> None:
    """The grouped flag list of every role, or of the one `--role` names; exit status 0 (2 for no such role)."""
    named = any(argument.partition("=")[0] == "--role" for argument in arguments)
    role = requested_role(arguments, {}) if named else None
    if role is not None and role not in ROLES:
        typer.echo(f"error: no role {role!r}; the roles are {', '.join(ROLES)}", err=True)
        raise typer.Exit(2)
    typer.echo(render_run_help(role), nl=False)
    raise typer.Exit(0)
