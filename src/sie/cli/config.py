"""`sie config …`: the admin client of the config service and of the gateways' worker-ack status.

Exit codes: 0 done, 1 refused by the service (the error is printed), 2 usage or connection problem.
The token comes from `--token` or SIE_ADMIN_TOKEN; the service URL from `--url` or SIE_CONFIG_SERVICE_URL.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.console import Console

from sie.settings import Settings, SettingsError, load_settings

app = typer.Typer(
    help="Write and read model configuration on the config service.", no_args_is_help=True, add_completion=False
)
console = Console(stderr=True)

UrlOption = Annotated[str | None, typer.Option("--url", help="Config service base URL (SIE_CONFIG_SERVICE_URL).")]
TokenOption = Annotated[str | None, typer.Option("--token", help="Bearer token (SIE_ADMIN_TOKEN).")]
ModelArg = Annotated[str, typer.Argument(help="Model id, e.g. org/model.")]
FileArg = Annotated[Path, typer.Argument(help="Model config YAML file.", exists=True, dir_okay=False)]


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        _usage(str(exc))


def _client(url: str | None, token: str | None) -> httpx.Client:
    settings = _settings()
    base = url or settings.config_sync.service_url
    if not base:
        _usage("no config service URL: pass --url or set SIE_CONFIG_SERVICE_URL")
    token = token or settings.auth.admin_token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base.rstrip("/"), headers=headers, timeout=30.0)


def _usage(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _send(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        _usage(f"cannot reach {client.base_url}: {exc}")
    if response.status_code >= 400:
        typer.echo(f"error: {response.status_code} {response.text}", err=True)
        raise typer.Exit(1)
    return response


def _print(response: httpx.Response) -> None:
    if response.headers.get("content-type", "").startswith("application/json"):
        typer.echo(json.dumps(response.json(), indent=2))
    else:
        typer.echo(response.text.rstrip())


@app.command()
def apply(
    file: FileArg,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key", help="Idempotency-Key header.")] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Add a model (or new profiles of one) from a YAML file; append-only."""
    headers = {"Content-Type": "application/x-yaml"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    with _client(url, token) as client:
        _print(_send(client, "POST", "/v1/configs/models", content=file.read_bytes(), headers=headers))


@app.command()
def replace(model_id: ModelArg, file: FileArg, url: UrlOption = None, token: TokenOption = None) -> None:
    """Replace one model's config wholesale."""
    with _client(url, token) as client:
        headers = {"Content-Type": "application/x-yaml"}
        _print(_send(client, "PUT", f"/v1/configs/models/{model_id}", content=file.read_bytes(), headers=headers))


@app.command()
def delete(model_id: ModelArg, url: UrlOption = None, token: TokenOption = None) -> None:
    """Delete an API-added model (needs a config store on the service)."""
    with _client(url, token) as client:
        _print(_send(client, "DELETE", f"/v1/configs/models/{model_id}"))


@app.command("list")
def list_models(
    url: UrlOption = None,
    token: TokenOption = None,
    raw: Annotated[bool, typer.Option("--json", help="Print the raw JSON document.")] = False,
) -> None:
    """List every model with its profiles and source, one per line (tab-separated)."""
    with _client(url, token) as client:
        document = _send(client, "GET", "/v1/configs/models").json()
    if raw:
        typer.echo(json.dumps(document, indent=2))
        return
    for model in document["models"]:
        typer.echo(f"{model['model_id']}\t{','.join(model['profiles'])}\t{model.get('source', '')}")


@app.command()
def get(model_id: ModelArg, url: UrlOption = None, token: TokenOption = None) -> None:
    """Print one model's YAML."""
    with _client(url, token) as client:
        _print(_send(client, "GET", f"/v1/configs/models/{model_id}"))


@app.command()
def bundles(url: UrlOption = None, token: TokenOption = None) -> None:
    """List the bundles the service knows."""
    with _client(url, token) as client:
        _print(_send(client, "GET", "/v1/configs/bundles"))


@app.command()
def epoch(url: UrlOption = None, token: TokenOption = None) -> None:
    """Print the epoch and the control-plane fingerprints."""
    with _client(url, token) as client:
        _print(_send(client, "GET", "/v1/configs/epoch"))


def _acked(gateway: str, model_id: str, token: str | None) -> tuple[bool, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(f"{gateway.rstrip('/')}/v1/configs/models/{model_id}/status", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        return False, f"{gateway}: unreachable ({exc})"
    if response.status_code != 200:
        return False, f"{gateway}: {response.status_code}"
    body = response.json()
    pending = sorted({w for bundle in body.get("bundles", []) for w in bundle.get("pending_workers", [])})
    summary = f"{gateway}: epoch {body.get('config_epoch')}, acked={body.get('all_bundles_acked')}"
    return bool(body.get("all_bundles_acked")), summary + (f", pending {pending}" if pending else "")


@app.command()
def status(
    model_id: ModelArg,
    gateway: Annotated[list[str], typer.Option("--gateway", help="Gateway base URL (repeat for each replica).")],
    wait: Annotated[bool, typer.Option("--wait", help="Poll until every gateway reports all bundles acked.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait with --wait.")] = 120.0,
    token: TokenOption = None,
) -> None:
    """Worker-ack status of a model on each gateway; with --wait, poll until all bundles are acked."""
    token = token or _settings().auth.admin_token
    deadline = time.monotonic() + timeout
    with console.status(f"waiting for workers to ack {model_id}…", spinner="dots") if wait else nullcontext():
        while True:
            answers = [_acked(url, model_id, token) for url in gateway]
            if all(ok for ok, _ in answers) or not wait or time.monotonic() > deadline:
                break
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # poll interval, never past the deadline
    for _, summary in answers:
        typer.echo(summary)
    raise typer.Exit(0 if all(ok for ok, _ in answers) else 1)
