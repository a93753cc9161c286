"""`sie pools …`: the operator front end of a gateway's pools API (`/v1/pools`, seed 000 §16.3): logical pools that
reserve worker capacity for one workload, leased for a TTL unless renewed.

`list` and `get` read them (a table in a terminal, tab-separated lines otherwise, or the raw JSON with `--json`:
`sie.cli.listing`); `create` leases one (`--gpu PROFILE=N` is the
capacity it requires, at least one; `--gpu-cap PROFILE=N` caps how many workers of a profile it is assigned);
`renew` extends its lease; `delete` drops it. `--gateway` is a gateway's base URL (default SIE_GATEWAY_URL, else
http://127.0.0.1:8080); the token comes from `--token` or SIE_ADMIN_TOKEN. Exit codes: 0 done, 1 refused by the
gateway (its message is printed), 2 usage or connection problem.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.console import Console

from sie.cli.control_http import echo_json, send_json, usage
from sie.cli.listing import Column, Listing, note, plain, show
from sie.settings import Settings, SettingsError, load_settings

app = typer.Typer(
    help="List, create, renew and delete the gateway's pools.", no_args_is_help=True, add_completion=False
)

DEFAULT_GATEWAY = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0
POOLS_PATH = "/v1/pools"

GatewayOption = Annotated[
    str | None, typer.Option("--gateway", help=f"Gateway base URL (default: SIE_GATEWAY_URL, else {DEFAULT_GATEWAY}).")
]
TokenOption = Annotated[str | None, typer.Option("--token", help="Bearer token (default: SIE_ADMIN_TOKEN).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the raw JSON document.")]
NameArg = Annotated[str, typer.Argument(help="Pool name: 1-63 characters from A-Z a-z 0-9 _ -.")]


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        usage(str(exc))


def _send(gateway: str | None, token: str | None, method: str, path: str, **kwargs: Any) -> Any:
    """The gateway's JSON answer to `method path`, with the URL and token from the flags or the settings."""
    if gateway is None or token is None:
        settings = _settings()
        gateway = gateway or settings.sidecar.gateway_url or DEFAULT_GATEWAY
        token = token or settings.auth.admin_token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return send_json(gateway, method, path, expected="a gateway", timeout_s=TIMEOUT_S, headers=headers, **kwargs)


def _pool_path(name: str) -> str:
    return f"{POOLS_PATH}/{quote(name, safe='')}"


def parse_counts(values: list[str], option: str, minimum: int) -> dict[str, int]:
    """`PROFILE=N` values as a mapping; a malformed, repeated or too small one exits 2 naming `option`."""
    counts: dict[str, int] = {}
    for value in values:
        profile, sep, count = value.partition("=")
        profile = profile.strip().lower()
        if not sep or not profile:
            usage(f"{option} {value!r}: expected PROFILE=COUNT, e.g. {option} l4=2")
        try:
            number = int(count)
        except ValueError:
            usage(f"{option} {value!r}: {count!r} is not a whole number")
        if number < minimum:
            usage(f"{option} {value!r}: the count must be at least {minimum}")
        if profile in counts:
            usage(f"{option} names machine profile {profile!r} twice")
        counts[profile] = number
    return counts


def _counts(counts: dict[str, Any] | None) -> str:
    return ",".join(f"{profile}={count}" for profile, count in sorted((counts or {}).items())) or "-"


def _workers(pool: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pool.get("status") or {}).get("assigned_workers") or [])


def _pools_listing(pools: list[dict[str, Any]], title: str) -> Listing:
    columns = [Column("name", overflow="fold"), *plain("state", "queue pool", "gpus", "caps", "bundle", "workers",
                                                           "min", "expires")]  # fmt: skip
    rows = []
    for pool in pools:
        spec, status = pool.get("spec") or {}, pool.get("status") or {}
        name = spec.get("name", "?") + (" (protected)" if pool.get("protected") else "")
        rows.append((
            name, status.get("state", ""), spec.get("queue_pool", "default"), _counts(spec.get("gpus")),
            _counts(spec.get("gpu_caps")), spec.get("bundle") or "any", str(len(_workers(pool))),
            str(spec.get("minimum_worker_count", 0)), _time(status.get("expires_at")),
        ))  # fmt: skip
    return Listing(title, columns, rows)


def _time(unix_s: object) -> str:
    """A pool time (unix seconds) as UTC ISO 8601; `never` when there is none."""
    if isinstance(unix_s, int | float) and not isinstance(unix_s, bool):
        return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="seconds")
    return str(unix_s) if unix_s else "never"


def _workers_listing(pool: dict[str, Any]) -> Listing:
    rows = []
    for worker in _workers(pool):
        profile = worker.get("machine_profile") or worker.get("gpu") or ""
        rows.append((worker.get("name", "?"), profile, worker.get("bundle") or "", str(worker.get("gpus", ""))))
    return Listing("assigned workers", plain("worker", "machine profile", "bundle", "gpus"), rows)


def _show(pool: dict[str, Any]) -> None:
    console = Console()
    show(_pools_listing([pool], "pool"), console)
    pinned = (pool.get("spec") or {}).get("pinned_models") or []
    if pinned:
        note(f"pinned models: {', '.join(pinned)}", console)
    if _workers(pool):
        show(_workers_listing(pool), console)
    else:
        note("no workers assigned yet", console)


@app.command("list")
def list_pools(raw: JsonOption = False, gateway: GatewayOption = None, token: TokenOption = None) -> None:
    """Every live pool: the default pool, static queue pools and leased logical pools."""
    document = _send(gateway, token, "GET", POOLS_PATH)
    if raw:
        echo_json(document)
        return
    show(_pools_listing(document.get("pools") or [], "pools"))


@app.command()
def get(name: NameArg, raw: JsonOption = False, gateway: GatewayOption = None, token: TokenOption = None) -> None:
    """One pool with its assigned workers."""
    pool = _send(gateway, token, "GET", _pool_path(name))
    if raw:
        echo_json(pool)
        return
    _show(pool)


@app.command()
def create(  # noqa: PLR0913 - one keyword per field of the pool spec
    name: NameArg,
    gpu: Annotated[
        list[str] | None, typer.Option("--gpu", help="Required capacity PROFILE=N (repeat per machine profile).")
    ] = None,
    gpu_cap: Annotated[
        list[str] | None, typer.Option("--gpu-cap", help="Assign at most N workers of PROFILE (repeatable).")
    ] = None,
    queue_pool: Annotated[
        str | None, typer.Option("--queue-pool", help="Backing queue pool: default or a static queue pool.")
    ] = None,
    bundle: Annotated[str | None, typer.Option("--bundle", help="Only workers of this bundle.")] = None,
    min_workers: Annotated[int | None, typer.Option("--min-workers", min=0, help="Warm floor of workers.")] = None,
    pin: Annotated[list[str] | None, typer.Option("--pin", help="Model kept loaded (repeatable).")] = None,
    ttl: Annotated[
        float | None, typer.Option("--ttl", min=1, help="Lease in seconds (default: the gateway's).")
    ] = None,
    raw: JsonOption = False,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Lease a pool; it expires after its TTL unless renewed."""
    if not gpu:
        usage("create needs at least one --gpu PROFILE=COUNT: the capacity the pool requires, e.g. --gpu l4=2")
    body: dict[str, Any] = {"name": name, "gpus": parse_counts(gpu, "--gpu", 1)}
    optional = {
        "gpu_caps": parse_counts(gpu_cap or [], "--gpu-cap", 0) or None,
        "queue_pool": queue_pool,
        "bundle": bundle,
        "minimum_worker_count": min_workers,
        "pinned_models": list(pin) if pin else None,
        "ttl_seconds": ttl,
    }
    body |= {key: value for key, value in optional.items() if value is not None}
    pool = _send(gateway, token, "POST", POOLS_PATH, json=body)
    if raw:
        echo_json(pool)
        return
    _show(pool)


@app.command()
def renew(name: NameArg, raw: JsonOption = False, gateway: GatewayOption = None, token: TokenOption = None) -> None:
    """Extend a pool's lease by its TTL from now."""
    pool = _send(gateway, token, "POST", f"{_pool_path(name)}/renew")
    if raw:
        echo_json(pool)
        return
    expires = _time((pool.get("status") or {}).get("expires_at"))
    typer.echo(f"renewed {name}: expires at {expires}")


@app.command()
def delete(name: NameArg, raw: JsonOption = False, gateway: GatewayOption = None, token: TokenOption = None) -> None:
    """Drop a pool (the default pool and static queue pools are protected)."""
    answer = _send(gateway, token, "DELETE", _pool_path(name))
    if raw:
        echo_json(answer)
        return
    typer.echo(f"deleted {answer.get('deleted', name)}")
