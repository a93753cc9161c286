"""`sie bench`: how fast a running server answers, measured from where the command runs — the benchmark a user points
at their own deployment (as Triton ships perf_analyzer).

For every pair of `--concurrency` (clients, each with one request in flight) and `--batch` (items per request), the
clients send encode requests of `--text` to `--model` for `--seconds`; the table gives requests and items per
second, the p50 and p99 latency of a request, and the errors. A progress bar runs in a terminal (plain lines
elsewhere); `--json` prints the rows as JSON. The load generator is Python on this machine: pointed at a server on
the same few cores it takes some of their time, so measure throughput limits from another machine (or with `wrk`).
Exit codes: 0 measured, 1 every request failed, 2 usage or connection problem.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Annotated, Any, Final

import attrs
import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from sie.cli.control_http import usage
from sie.cli.listing import Column, Listing, show

DEFAULT_URL: Final = "http://127.0.0.1:8080"
DEFAULT_TEXT: Final = "SIE turns text into vectors for search, recommendations and retrieval-augmented generation."
REQUEST_TIMEOUT_S: Final = 60.0

app = typer.Typer(help="Measure a running server's throughput and latency.", add_completion=False)


@attrs.frozen
class Cell:
    """One measured pair: clients, items per request, and what they got."""

    concurrency: int
    batch: int
    seconds: float
    latencies_ms: list[float]
    errors: int
    first_error: str = ""

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0

    @property
    def items_per_s(self) -> float:
        return self.requests_per_s * self.batch

    def percentile_ms(self, share: float) -> float | None:
        """The latency under which `share` of the answered requests came back; None when none was."""
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    def row(self) -> dict[str, Any]:
        p50, p99 = self.percentile_ms(0.5), self.percentile_ms(0.99)
        return {
            "concurrency": self.concurrency, "batch": self.batch, "requests": len(self.latencies_ms),
            "requests_per_s": round(self.requests_per_s, 2), "items_per_s": round(self.items_per_s, 2),
            "p50_ms": round(p50, 2) if p50 is not None else None, "p99_ms": round(p99, 2) if p99 is not None else None,
            "errors": self.errors, "first_error": self.first_error,
        }  # fmt: skip


async def measure_cell(  # noqa: PLR0913 - the cell and where to send it
    client: httpx.AsyncClient, path: str, text: str, concurrency: int, batch: int, seconds: float
) -> Cell:
    """`concurrency` clients sending encode requests of `batch` copies of `text` to `path` for `seconds`."""
    return await drive(client, path, [{"items": [{"text": text} for _ in range(batch)]}], concurrency, seconds)


async def drive(
    client: httpx.AsyncClient, path: str, bodies: Sequence[dict[str, Any]], concurrency: int, seconds: float
) -> Cell:
    """`concurrency` clients, one request in flight each, posting `bodies` to `path` for `seconds`: client k sends
    body k, k+1, ... round the list (distinct texts keep a cache from answering). The cell's batch is the first
    body's item count."""
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds

    async def one_client(first: int) -> None:
        index = first
        while time.perf_counter() < deadline:
            body = bodies[index % len(bodies)]
            index += 1
            started = time.perf_counter()
            try:
                response = await client.post(path, json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if response.status_code == httpx.codes.OK:
                latencies.append((time.perf_counter() - started) * 1000.0)
            else:
                errors.append(f"HTTP {response.status_code}: {response.text[:200]}")

    started = time.perf_counter()
    await asyncio.gather(*(one_client(first) for first in range(concurrency)))
    elapsed = time.perf_counter() - started
    batch = len(bodies[0].get("items") or ()) or 1
    return Cell(concurrency, batch, elapsed, latencies, len(errors), errors[0] if errors else "")


async def measure(url: str, path: str, bodies: Sequence[dict[str, Any]], concurrency: int, seconds: float) -> Cell:
    """`drive` over a client of its own with a connection per client: what the benchmark scripts of this repository
    measure a server with when `wrk` cannot express their load."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        return await drive(client, path, bodies, concurrency, seconds)


async def run_bench(  # noqa: PLR0913 - the benchmark's knobs
    url: str,
    model: str,
    concurrencies: Sequence[int],
    batches: Sequence[int],
    seconds: float,
    text: str,
    console: Console,
) -> list[Cell]:
    """Every (concurrency, batch) cell in turn, after one warm-up request (the model loads); a progress bar in a
    terminal, a line per cell elsewhere."""
    path = f"/v1/encode/{model}"
    cells: list[Cell] = []
    limits = httpx.Limits(max_connections=max(concurrencies), max_keepalive_connections=max(concurrencies))
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        warm = await client.post(path, json={"items": [{"text": text}]})
        if warm.status_code != httpx.codes.OK:
            usage(f"{model} at {url} answered the warm-up with HTTP {warm.status_code}: {warm.text[:300]}")
        pairs = [(concurrency, batch) for concurrency in concurrencies for batch in batches]
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console,
                      disable=not console.is_terminal) as progress:  # fmt: skip
            task = progress.add_task("measuring", total=len(pairs))
            for concurrency, batch in pairs:
                progress.update(task, description=f"{concurrency} clients x batch {batch}")
                cell = await measure_cell(client, path, text, concurrency, batch, seconds)
                cells.append(cell)
                progress.advance(task)
                if not console.is_terminal:
                    console.file.write(f"measured {concurrency} clients x batch {batch}: "
                                       f"{cell.items_per_s:.1f} items/s\n")  # fmt: skip
    return cells


def _counts(value: str, option: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        usage(f"{option} {value!r}: expected whole numbers separated by commas, e.g. {option} 1,8,32")
    if not counts or any(count < 1 for count in counts):
        usage(f"{option} {value!r}: every number must be at least 1")
    return counts


@app.callback(invoke_without_command=True)
def bench(  # noqa: PLR0913 - the command's options
    model: Annotated[str, typer.Option("--model", help="The model to encode with, as the API names it.")],
    url: Annotated[str, typer.Option("--url", help=f"Server base URL (default {DEFAULT_URL}).")] = DEFAULT_URL,
    concurrency: Annotated[str, typer.Option("--concurrency", help="Clients, one request in flight each.")] = "1,8,32",
    batch: Annotated[str, typer.Option("--batch", help="Items per request.")] = "1,32",
    seconds: Annotated[float, typer.Option("--seconds", min=0.1, help="How long each pair is measured.")] = 5.0,
    text: Annotated[str, typer.Option("--text", help="The text every item carries.")] = DEFAULT_TEXT,
    raw: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    ceiling: Annotated[
        bool,
        typer.Option(
            "--ceiling",
            help="Also run the model in-process here (this machine's catalogue and model "
            "cache, onnxruntime, no server): the items/s each batch size could reach at most.",
        ),
    ] = False,  # fmt: skip
) -> None:
    """Measure throughput and latency of encode requests for each pair of concurrency and batch size."""
    concurrencies, batches = _counts(concurrency, "--concurrency"), _counts(batch, "--batch")
    console = Console(stderr=raw)
    try:
        cells = asyncio.run(run_bench(url, model, concurrencies, batches, seconds, text, console))
    except httpx.HTTPError as exc:
        usage(f"cannot reach {url}: {exc}")
    rows = [cell.row() for cell in cells]
    if ceiling:
        limits = local_ceiling(model, batches, text, seconds)
        for row in rows:
            row["ceiling_items_per_s"] = round(limits[row["batch"]], 2)
    if raw:
        typer.echo(json.dumps({"model": model, "url": url, "seconds": seconds, "rows": rows}, indent=2))
    else:
        show(_listing(model, rows), Console())
    if all(not cell.latencies_ms for cell in cells):
        typer.echo(f"every request failed: {cells[0].first_error}", err=True)
        raise typer.Exit(1)


def _listing(model: str, rows: list[dict[str, Any]]) -> Listing:
    headers = ["clients", "batch", "requests/s", "items/s", "p50 ms", "p99 ms", "errors"]
    with_ceiling = any("ceiling_items_per_s" in row for row in rows)
    if with_ceiling:
        headers.append("ceiling items/s")
    shown = []
    for row in rows:
        cells = [str(row["concurrency"]), str(row["batch"]), f"{row['requests_per_s']:.1f}",
                 f"{row['items_per_s']:.1f}", _ms(row["p50_ms"]), _ms(row["p99_ms"]), str(row["errors"])]  # fmt: skip
        if with_ceiling:
            cells.append(f"{row['ceiling_items_per_s']:.1f}")
        shown.append(cells)
    return Listing(f"sie bench: {model}", [Column(header, justify="right") for header in headers], shown)


def local_ceiling(model: str, batches: Sequence[int], text: str, seconds: float) -> dict[int, float]:
    """Items per second the model reaches in this process for each batch size: loaded from this machine's
    catalogue and model cache (SIE_MODELS_DIR, SIE_MODEL_CACHE) and encoded for `seconds` per batch, tokenizer
    included, no server. The worker stack is imported here only, when asked for."""
    from sie.catalog import load_catalog
    from sie.catalog.errors import CatalogErrors, ModelNotFoundError
    from sie.settings import SettingsError, load_settings
    from sie.wire.ipc_batch import EncodeBatchItem
    from sie.worker.errors import ModelLoadError
    from sie.worker.loading import ModelLoader

    try:
        settings = load_settings()
        entry = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir).get(model)
        adapter = ModelLoader.from_settings(settings.worker).load(entry.model, entry.profile, entry.model_id).adapter
    except (SettingsError, CatalogErrors, ModelNotFoundError, ModelLoadError) as exc:
        usage(f"--ceiling: cannot load {model} here: {exc}")
    rates: dict[int, float] = {}
    for size in batches:
        items = [EncodeBatchItem(work_item_id=f"c.{i}", request_id="c", item_index=i, total_items=size,
                                 timestamp=0.0, item={"text": text}) for i in range(size)]  # fmt: skip
        adapter.encode(items)  # warm up
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            adapter.encode(items)
            done += size
        rates[size] = done / (time.perf_counter() - started)
    return rates


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
