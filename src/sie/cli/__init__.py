"""The `sie` command line (typer): `sie run`, `sie catalog …` and the commands later roles add."""
