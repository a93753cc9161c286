"""What metrics and tracing cost a serving `all` process, measured side by side in one run.

    .venv/bin/python scripts/bench/telemetry.py [--rounds 6] [--load-seconds 5] [--clients 32]

Four settings of the same checkout: `off` (SIE_METRICS_ENABLED=false, no tracing), `metrics` (the default), and
metrics with tracing at 5 % (the sampling seed 000 §13 deploys) and at 100 % of traces, spans posted over OTLP/HTTP
to a sink in this process that answers as a collector would. Each measurement starts a fresh `sie run --role all`,
so a server process's own luck (where its memory and threads land) is spread over the rounds instead of favouring
one setting; the order of the settings rotates every round. Per measurement: 32 concurrent clients × 1 sentence and
1 client × batches of 32, each a steady state of `--load-seconds` sent by `sie bench`'s load (`sie.cli.bench.measure`),
and the server's CPU seconds per request (from
/proc, the process and its children) over the concurrent scenario: CPU per request is what telemetry adds to, and
moves far less than throughput when the load generator shares the machine's cores.

The table gives medians over the rounds and, per setting, the median of its per-round ratio to `off` in the same
round (the paired figure the goal is checked against: metrics+tracing within 3 % of off).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_ort import SENTENCES  # noqa: E402
from topology import HOST, start_all  # noqa: E402

from sie.cli.bench import Cell, measure  # noqa: E402 - the load `sie bench` sends

# The servers run this checkout's code even when another one is installed in the venv (a worktree of a commit).
SOURCE = Path(__file__).resolve().parents[2] / "src"
WARM_UP_S = 1.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class _Sink(BaseHTTPRequestHandler):
    """Accepts every OTLP export with the empty success message, and counts the bodies."""

    received = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        return


@contextmanager
def otlp_sink():
    server = ThreadingHTTPServer((HOST, 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def process_tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and its live descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = int(fields[11]) + int(fields[12])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(times.get(member, 0) for member in tree) / CLOCK_TICKS


def bodies(per_request: int) -> list[dict]:
    """One body per rotation of the benchmark sentences, `per_request` items each."""
    count = len(SENTENCES)
    return [{"items": [{"text": SENTENCES[(i + j) % count]} for j in range(per_request)]} for i in range(count)]


def load(url: str, model: str, per_request: int, clients: int, seconds: float) -> Cell:
    """`clients` clients with `per_request` items per request for `seconds` (`sie bench`'s load); none may fail."""
    cell = asyncio.run(measure(url, f"/v1/encode/{model}", bodies(per_request), clients, seconds))
    if cell.errors:
        raise SystemExit(f"{cell.errors} requests failed, the first: {cell.first_error}")
    return cell


def measure_server(url: str, pid: int, model: str, clients: int, seconds: float) -> dict[str, float]:
    load(url, model, 1, clients, WARM_UP_S)
    cpu_before = process_tree_cpu_seconds(pid)
    wide = load(url, model, 1, clients, seconds)
    cpu_seconds = process_tree_cpu_seconds(pid) - cpu_before
    load(url, model, 32, 1, WARM_UP_S)
    batch = load(url, model, 32, 1, seconds)
    return {
        f"{clients} clients x 1 sentence, sent/s": wide.items_per_s,
        "1 client x batch of 32, sent/s": batch.items_per_s,
        f"server CPU ms per request ({clients} clients)": 1000 * cpu_seconds / max(1, len(wide.latencies_ms)),
    }


def settings(sink_url: str) -> dict[str, dict[str, str]]:
    return {
        "off": {"SIE_METRICS_ENABLED": "false"},
        "metrics": {},
        "metrics+tracing 5%": {
            "SIE_TRACING_ENABLED": "true",
            "SIE_TRACING_SAMPLE_RATIO": "0.05",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{sink_url}/v1/traces",
        },
        "metrics+tracing 100%": {
            "SIE_TRACING_ENABLED": "true",
            "SIE_TRACING_SAMPLE_RATIO": "1",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{sink_url}/v1/traces",
        },
    }


def run_once(env: dict[str, str], args: argparse.Namespace, log: Path) -> dict[str, float]:
    server_env = {"SIE_HTTP_SERVER": args.http_server, "PYTHONPATH": str(SOURCE), **env}
    process, url = start_all(["--preload", args.model], server_env, log)
    try:
        return measure_server(url, process.pid, args.model, args.clients, args.load_seconds)
    finally:
        process.stop()


def report(results: dict[str, list[dict[str, float]]]) -> None:
    rounds = len(results["off"])
    print(f"medians of {rounds} rounds, a fresh server per measurement, settings rotated every round")
    print("| setting | measure | median | paired ratio to off |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        for measure_name in runs[0]:
            median = statistics.median(run[measure_name] for run in runs)
            ratios = [run[measure_name] / off[measure_name] for run, off in zip(runs, results["off"], strict=True)]
            ratio = statistics.median(ratios)
            print(f"| {name} | {measure_name} | {median:,.2f} | {ratio:.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--load-seconds", type=float, default=5.0, help="steady-state time per scenario")
    parser.add_argument("--http-server", default="uvicorn", choices=("hypercorn", "uvicorn"))
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="sie-bench-telemetry-"))
    with otlp_sink() as sink_url:
        named = settings(sink_url)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in named}
        order = list(named)
        for index in range(args.rounds):
            shift = index % len(order)
            for name in order[shift:] + order[:shift]:
                print(f"round {index + 1}/{args.rounds}: {name}", file=sys.stderr)
                results[name].append(run_once(named[name], args, logs / f"{index}-{name}.log"))
        if _Sink.received == 0:
            raise SystemExit("tracing was on but no span reached the sink")
        print(f"OTLP trace exports received: {_Sink.received}")
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
