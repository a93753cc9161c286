"""How the operator commands (`sie placement`, `sie dlq`) talk to a running server's JSON control routes: one
request, its JSON answer, and the CLI's exit codes: 1 when the server refused (its envelope's message is printed),
2 for a usage or connection problem."""

from __future__ import annotations

import json
from typing import Any, NoReturn

import httpx
import typer


def usage(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def echo_json(document: Any) -> None:
    typer.echo(json.dumps(document, indent=2))


def send_json(url: str, method: str, path: str, *, expected: str, timeout_s: float, **kwargs: Any) -> Any:
    """The JSON `url` answers to `method path` (httpx keyword arguments pass through); a refusal exits 1 with its
    message, no answer or a non-JSON one exits 2 (`expected` names the server the URL should be)."""
    try:
        response = httpx.request(method, f"{url.rstrip('/')}{path}", timeout=timeout_s, **kwargs)
    except httpx.HTTPError as exc:
        usage(f"cannot reach {url}: {exc}")
    if response.status_code >= 400:
        typer.echo(f"error: {response.status_code} {error_message(response)}", err=True)
        raise typer.Exit(1)
    try:
        return response.json()
    except ValueError:
        usage(f"{url} answered something other than JSON; is it {expected}?")


def error_message(response: httpx.Response) -> str:
    """The message of an error envelope (`{"detail": {...}}`, `{"error": {...}}`, or either as a string), else the
    raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()
    for key in ("detail", "error"):
        error = body.get(key) if isinstance(body, dict) else None
        if isinstance(error, dict):
            return str(error.get("message", error))
        if isinstance(error, str):
            return error
    return response.text.strip()
