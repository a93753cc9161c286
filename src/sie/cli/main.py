"""The `sie` entrypoint: builds the typer app from the command groups and runs it."""

from __future__ import annotations

import importlib.metadata

import typer

from sie.cli import catalog, config, dlq, models, placement, pools, run

app = typer.Typer(
    name="sie",
    help="SIE: embeddings, reranking and entity extraction served from ONNX models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(catalog.app, name="catalog")
app.add_typer(models.app, name="models")
app.add_typer(config.app, name="config")
app.add_typer(placement.app, name="placement")
app.add_typer(dlq.app, name="dlq")
app.add_typer(pools.app, name="pools")
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
    app()


if __name__ == "__main__":
    main()
