"""`sie dlq …`: the operator front end of a gateway's dead-letter queue (`/v1/dlq`, seed 000 §8): work items that
used every delivery (SIE_MAX_DELIVER) without being settled, kept for 24 hours.

`list` and `show` read them; `replay` sends one back to its original work subject once the cause is fixed (with a
fresh request id and a deadline of now + the gateway's request timeout; nobody waits for its results, which are
discarded); `delete` drops one; `purge` drops them all. `--url` is a gateway's base URL (the `all` role's HTTP
port too); the token comes from `--token` or SIE_ADMIN_TOKEN. Exit codes: 0 done, 1 refused by the gateway (its
message is printed), 2 usage or connection problem.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from sie.cli.control_http import echo_json, send_json, usage
from sie.cli.listing import Column, Listing, note, plain
from sie.cli.listing import show as show_listing
from sie.settings import SettingsError, load_settings

app = typer.Typer(
    help="List, show, replay and purge the gateway's dead letters.", no_args_is_help=True, add_completion=False
)

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0

UrlOption = Annotated[str, typer.Option("--url", help="Base URL of a gateway (or of the all role).")]
TokenOption = Annotated[str | None, typer.Option("--token", help="Bearer token (default: SIE_ADMIN_TOKEN).")]
LetterArg = Annotated[int, typer.Argument(help="Dead letter id, as `sie dlq list` shows it.", min=1)]


def _token(token: str | None) -> str | None:
    if token:
        return token
    try:
        return load_settings().auth.admin_token
    except SettingsError as exc:
        usage(str(exc))


def _send(url: str, token: str | None, method: str, path: str, **kwargs: Any) -> Any:
    token = _token(token)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return send_json(url, method, path, expected="a gateway", timeout_s=TIMEOUT_S, headers=headers, **kwargs)


@app.command("list")
def list_letters(
    after: Annotated[int, typer.Option("--after", min=0, help="Only letters with a larger id.")] = 0,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 100,
    raw: Annotated[bool, typer.Option("--json", help="Print the raw JSON document.")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """The dead letters, oldest first."""
    document = _send(url, token, "GET", "/v1/dlq", params={"after": after, "limit": limit})
    if raw:
        echo_json(document)
        return
    letters = document["dead_letters"]
    console = Console()
    if not letters:
        note("no dead letters", console)
        return
    show_listing(_letters_listing(letters), console)
    if document["next_after"] is not None:
        note(f"more: sie dlq list --after {document['next_after']}", console)


def _letters_listing(letters: list[dict[str, Any]]) -> Listing:
    columns = [Column("id"), Column("model", overflow="fold", ratio=2), Column("request", overflow="fold", ratio=2),
               *plain("operation", "deliveries", "dead at")]  # fmt: skip
    rows = [
        (str(letter["id"]), letter["model"] or letter["subject"], letter["request_id"] or "(not a work item)",
         letter["operation"] or "", str(letter["deliveries"]), letter["dead_at"])
        for letter in letters
    ]  # fmt: skip
    return Listing("dead letters", columns, rows)


@app.command()
def show(letter_id: LetterArg, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """One dead letter with its work item, as JSON."""
    echo_json(_send(url, token, "GET", f"/v1/dlq/{letter_id}"))


@app.command()
def replay(letter_id: LetterArg, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Send a dead letter's work item back to its work subject (results are discarded), and drop the letter."""
    echo_json(_send(url, token, "POST", f"/v1/dlq/{letter_id}/replay"))


@app.command()
def delete(letter_id: LetterArg, url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """Drop one dead letter."""
    echo_json(_send(url, token, "DELETE", f"/v1/dlq/{letter_id}"))


@app.command()
def purge(
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Drop every dead letter."""
    if not yes and not typer.confirm(f"Drop every dead letter of {url}?"):
        typer.echo("nothing purged")
        raise typer.Exit(1)
    echo_json(_send(url, token, "POST", "/v1/dlq/purge"))
