"""Where one request's time goes: a timeline of a sequential single-sentence request through the server, from the
ASGI app's entry to the observers after the answer, with the sidecar's stages and the worker's run in between.

    .venv/bin/python scripts/bench/timeline.py [--mode all|distributed] [--http-server hypercorn|uvicorn]
        [--seconds 4] [--compare-ref REF] [--trace module:Qualified.name ...]

The topology's `sie run` processes load `scripts/bench/trace_hook` (PYTHONPATH), which wraps the traced functions
and records each call's entry and exit on the monotonic clock all processes share. wrk sends single sentences on
one connection for `--seconds`; then, for every request after the first 50, each traced function's first call
that began inside the request (entry of `starlette.applications:Starlette.__call__`) is placed relative to that
entry. The table gives the medians: when it starts, when it ends, how long it runs. Times are those of a cold
request on a shared machine: 2-3x what the same code takes in a tight loop, and the wrappers add a few µs each.
With `--compare-ref REF` the same is printed for that commit's code (functions it does not have are left out).
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import checkout_of, encode_bodies  # noqa: E402
from topology import Topology  # noqa: E402
from wrk import run_wrk, wrk_binary  # noqa: E402

HOOK = Path(__file__).resolve().parent / "trace_hook"
ANCHOR = "starlette.applications:Starlette.__call__"
WARM_UP_REQUESTS = 50
TRACED = (
    ANCHOR,
    "sie.telemetry.requests:ObservedRequests.__call__",
    "sie.gateway.http.inference:InferenceHandlers.encode",
    "sie.http.bodies:read_body",
    "sie.gateway.http.negotiation:decode_request",
    "sie.gateway.dispatch:Dispatcher.collect",
    "sie.gateway.dispatch:Dispatcher._admit",
    "sie.gateway.publisher:WorkPublisher.publish",
    "sie.gateway.collector:PendingRequest.wait",
    "sie.sidecar.consumer:Consumer.accept",
    "sie.sidecar.readiness:Readiness.admit",
    "sie.sidecar.prep:Preparer.prepare",
    "sie.tokenization.tokenizer:TextTokenizer.encode_batch",
    "sie.sidecar.scheduler:Scheduler.submit",
    "sie.sidecar.dispatcher:BatchDispatcher.dispatch",
    "sie.sidecar.pod.fleet:WorkerFleet.run_batch",
    "sie.ipc.server:IpcServer._call",
    "sie.worker.service:WorkerService.run_batch",
    "sie.worker.runner:BatchRunner.execute",
    "sie.worker.adapters.encoder:TextEncoderAdapter.encode",
    "sie.worker.adapters.base:Adapter.run_session",
    "sie.worker.adapters.dense:DenseAdapter.represent",
    "sie.telemetry.sidecar:SidecarMetrics.batch",
    "sie.sidecar.dispatcher:BatchDispatcher._finish",
    "sie.sidecar.settlement:Settler.reply",
    "sie.gateway.collector:PendingRequest.fill",
    "sie.gateway.http.edge:served_response",
    "starlette.responses:Response.__call__",
    "sie.telemetry.access:log_access",
    "sie.telemetry.http:HttpMetrics.observe",
)

Calls = list[tuple[str, float, float]]


def traced_run(
    topology_of: Callable[[dict[str, str]], Topology], seconds: int, model: str, targets: list[str]
) -> tuple[float, Calls]:
    """(wrk's p50 in ms, every traced call of every process) for one topology under sequential load."""
    with tempfile.TemporaryDirectory(prefix="sie-bench-timeline-") as directory:
        env = {"PYTHONPATH": str(HOOK), "BENCH_TRACE": " ".join(targets), "BENCH_TRACE_OUT": f"{directory}/%p.json"}
        topology = topology_of(env)
        try:
            topology.wait_serving(model)
            bodies = encode_bodies(1)
            run_wrk(topology.url, f"/v1/encode/{model}", bodies, 1, 1, 1)
            stats = run_wrk(topology.url, f"/v1/encode/{model}", bodies, 1, seconds, 1)
        finally:
            topology.stop()
        calls: Calls = [tuple(call) for path in Path(directory).glob("*.json") for call in json.loads(path.read_text())]
    return stats.p50_s * 1000, calls


def timeline(calls: Calls) -> list[tuple[str, float, float, float, int]]:
    """(function, median start, median end, median duration in ms, requests) relative to each request's anchor."""
    calls = sorted(calls, key=lambda call: call[1])
    starts = [call[1] for call in calls]
    requests = [call for call in calls if call[0] == ANCHOR.partition(":")[2]][WARM_UP_REQUESTS:]
    placed: dict[str, list[tuple[float, float]]] = {}
    for _, begin, end in requests:
        seen: set[str] = set()
        for name, start, stop in calls[bisect.bisect_left(starts, begin) :]:
            if start > end:
                break
            if name not in seen:
                seen.add(name)
                placed.setdefault(name, []).append(((start - begin) * 1000, (stop - begin) * 1000))
    rows = [
        (
            name,
            statistics.median(start for start, _ in spans),
            statistics.median(stop for _, stop in spans),
            statistics.median(stop - start for start, stop in spans),
            len(spans),
        )
        for name, spans in placed.items()
    ]
    return sorted(rows, key=lambda row: row[1])


def print_timeline(label: str, p50_ms: float, calls: Calls) -> None:
    print(f"{label}: wrk p50 {p50_ms:.2f} ms")
    print("| function | start ms | end ms | duration ms | requests |")
    print("|---|---|---|---|---|")
    for name, start, end, duration, count in timeline(calls):
        print(f"| {name} | {start:.3f} | {end:.3f} | {duration:.3f} | {count} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--mode", choices=("all", "distributed"), default="all")
    parser.add_argument("--http-server", choices=("hypercorn", "uvicorn"), default="hypercorn")
    parser.add_argument("--seconds", type=int, default=4, help="measured seconds of sequential load")
    parser.add_argument("--compare-ref", help="a commit whose timeline is printed after this checkout's")
    parser.add_argument("--trace", action="append", default=[], help="another module:Qualified.name to trace")
    args = parser.parse_args(argv)
    wrk_binary()
    targets = [*TRACED, *args.trace]
    runs = [("this checkout", None)]
    if args.compare_ref:
        runs.append((args.compare_ref, checkout_of(args.compare_ref)))
    for label, source in runs:

        def topology_of(env: dict[str, str], source: Path | None = source) -> Topology:
            return Topology(args.mode, args.model, "onnx", [], args.http_server, source, env)

        p50_ms, calls = traced_run(topology_of, args.seconds, args.model, targets)
        print_timeline(f"{label}, {args.mode}/{args.http_server}", p50_ms, calls)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
