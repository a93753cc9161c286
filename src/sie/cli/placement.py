"""`sie placement …`: the operator front end of a pod's placement control surface (seed 002 "Runtime scheduling
control"): show the placement, override a model's replicas and fill, change policy knobs, repack now.

`--url` is the surface's base URL: the `all` role serves it on its HTTP port (8080 by default), a sidecar on its
probe port (SIE_WORKER_PROBE_PORT, 9095 by default). Exit codes: 0 done, 1 refused by the server (its message is
printed), 2 usage or connection problem.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from sie.cli.control_http import echo_json, send_json, usage
from sie.cli.listing import Column, Listing, note, plain, show

app = typer.Typer(
    help="Show and retune how a pod places batches on its worker children.", no_args_is_help=True, add_completion=False
)

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 10.0

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        help="Base URL of the placement surface: the all role's HTTP port, or a sidecar's probe port (9095).",
    ),
]


def _send(url: str, method: str, path: str, timeout_s: float = TIMEOUT_S, **kwargs: Any) -> Any:
    return send_json(url, method, path, expected="a placement surface", timeout_s=timeout_s, **kwargs)


@app.command()
def status(
    url: UrlOption = DEFAULT_URL,
    raw: Annotated[bool, typer.Option("--json", help="Print the raw JSON document.")] = False,
) -> None:
    """The placement: policy, worker children and where each model runs."""
    document = _send(url, "GET", "/v1/placement")
    if raw:
        echo_json(document)
        return
    console = Console()
    note(
        f"mode {document['mode']}, work basis {document['work_basis']}, "
        f"routing {document['routing_policy']}, fill {document['fill_mode']}",
        console,
    )
    show(_children_listing(document["children"]), console)
    show(_models_listing(document["models"]), console)
    repacks = document["repacks"]
    last = repacks["last"]
    summary = f"repacks: {repacks['total']}"
    if last is not None:
        summary += f"; last by {last['trigger']}, moved {', '.join(last['moved']) or 'nothing'}"
    compaction = document.get("compaction")
    if compaction:
        freed_mib = compaction["freed_bytes_total"] / 2**20
        summary += (
            f"; compaction {document['policy']['compaction_mode']}: {compaction['unloads_total']} models unloaded, "
            f"{freed_mib:.1f} MiB freed" + (" (under way)" if compaction["pending"] else "")
        )
    note(summary, console)


def _children_listing(children: list[dict[str, Any]]) -> Listing:
    columns = [*plain("worker", "device", "ready"), Column("loaded", overflow="fold"),
               Column("inflight b/i/work", justify="right"), Column("compute s", justify="right")]  # fmt: skip
    rows = []
    for child in children:
        inflight = child["inflight"]
        rows.append((
            child["name"], child["device"], "yes" if child["ready"] else "no", "\n".join(child["loaded_models"]),
            f"{inflight['batches']}/{inflight['items']}/{inflight['work']:.3g}",
            f"{child['compute_seconds_total']:.1f}",
        ))  # fmt: skip
    return Listing("children", columns, rows)


def _models_listing(models: list[dict[str, Any]]) -> Listing:
    columns = [Column("model", overflow="fold", ratio=3), *plain("replicas", "worker weight batches", "fill"),
               Column("quantum", justify="right"), Column("demand", justify="right")]  # fmt: skip
    rows = []
    for model in models:
        workers = "\n".join(
            f"{replica['worker']} {replica['weight']:.2f} {replica['routed_batches']}" for replica in model["replicas"]
        )
        rows.append((
            model["model"], f"{len(model['replicas'])} of {model['replicas_setting']}", workers,
            f"{model['fill_mode']} x{model['fill_factor']:g}", str(model["fill_quantum"]), f"{model['demand']:.3g}",
        ))  # fmt: skip
    return Listing("models", columns, rows)


@app.command("set-replicas")
def set_replicas(
    model: Annotated[str, typer.Argument(help="Model id, e.g. BAAI/bge-m3.")],
    replicas: Annotated[str, typer.Argument(help="A whole number of replicas, or 'all'.")],
    fill_mode: Annotated[str | None, typer.Option("--fill-mode", help="run, spread or inflight.")] = None,
    fill_factor: Annotated[
        float | None, typer.Option("--fill-factor", help="Quantum as a multiple of max batch.")
    ] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Override one model's replicas (and fill); in force from the next repack."""
    fields: dict[str, Any] = {"replicas": _replica_count(replicas)}
    if fill_mode is not None:
        fields["fill_mode"] = fill_mode
    if fill_factor is not None:
        fields["fill_factor"] = fill_factor
    echo_json(_send(url, "POST", f"/v1/placement/models/{model}", json=fields))


def _replica_count(text: str) -> int | str:
    if text.lower() == "all":
        return "all"
    if not text.isdigit():
        usage(f"replicas must be a whole number or 'all', got {text!r}")
    return int(text)


@app.command("set-policy")
def set_policy(
    knobs: Annotated[list[str], typer.Argument(help="KEY=VALUE pairs, e.g. hysteresis=0.15 routing_policy=fill_rr.")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Change fleet-wide placement knobs (every one but mode); prints the new policy."""
    echo_json(_send(url, "POST", "/v1/placement/policy", json=dict(_knob(pair) for pair in knobs)))


def _knob(pair: str) -> tuple[str, Any]:
    """`KEY=VALUE`; the value is read as JSON (numbers, true/false) and otherwise kept as text."""
    key, sep, value = pair.partition("=")
    if not sep or not key:
        usage(f"expected KEY=VALUE, got {pair!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


@app.command()
def repack(
    wait: Annotated[float, typer.Option("--wait", min=0, help="Seconds to wait for new replicas (at most 300).")] = 0.0,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Repack now (lpt_packing only); prints what moved."""
    echo_json(_send(url, "POST", "/v1/placement/repack", timeout_s=wait + TIMEOUT_S, params={"wait": wait}))
