"""The `sie` entrypoint: the typer app of `sie run` and the command groups, each group's module imported only when
that group runs (or `sie --help` lists it), so `sie run` starts with none of their stacks (HTTP clients, tables, the
worker's loader)."""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Final

import click
import typer
from typer.core import TyperGroup

from sie.cli import run

# `sie NAME …` → the module whose typer `app` holds the group, in the order `sie --help` lists them.
COMMAND_GROUPS: Final = {
    "catalog": "sie.cli.catalog",
    "models": "sie.cli.models",
    "config": "sie.cli.config",
    "placement": "sie.cli.placement",
    "dlq": "sie.cli.dlq",
    "pools": "sie.cli.pools",
    "bench": "sie.cli.bench",
}


class LazyGroups(TyperGroup):
    """The `sie` group: its command groups come from their modules on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMAND_GROUPS, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMAND_GROUPS.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        group = typer.main.get_command(importlib.import_module(module).app)
        group.name = cmd_name
        return group


app = typer.Typer(
    name="sie",
    cls=LazyGroups,
    help="SIE: embeddings, reranking and entity extraction served from ONNX models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command(
    name="run",
    help=run.RUN_HELP,
    # `sie run --help` is answered by run.run itself: the flags it lists depend on the role.
    add_help_option=False,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)(run.run)


def _version() -> str:
    try:
        return importlib.metadata.version("sie")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree without install
        return "0+unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"sie {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """SIE: embeddings, reranking and entity extraction served from ONNX models."""


def main() -> None:
    app(obj=run.COMMAND_PROCESS)


if __name__ == "__main__":
    main()
