"""Serving overhead, measured side by side in one run: raw onnxruntime (the ceiling) against the
`all` and `distributed` topologies over HTTP, interleaved for `--rounds` rounds, medians with ratios.

    .venv/bin/python scripts/bench/serve.py [--rounds 3] [--mode all|distributed|both] [--backend onnx|null]
        [--http-server hypercorn|uvicorn|hypercorn,uvicorn] [--compare-src OTHER_CHECKOUT/src]

Per round: the raw in-process ceiling at batch 32 (best of 1 and 2 intra-op threads) and at batch 1;
then per topology: 32 concurrent clients × 1 sentence per request, 1 client × batches of 32,
sequential single sentences (p50/p95). Each scenario is a steady state: after a short warm-up every
client keeps sending until `--load-seconds` have passed, so all of them are active the whole time.
With `--backend null` the worker runs no model and the table shows the items/s the gateway → queue →
sidecar → IPC path carries (32 clients × 32 items).
Each topology runs once per `--http-server` (default both: rows `all/hypercorn: …`, `all/uvicorn: …`).
`--compare-src` adds the `all` topology of another checkout (rows `before/all/…`), interleaved with this
one's in the same rounds: a before/after comparison on one machine at one time. `--compare-arg` (repeatable) adds
this checkout's `all` topology once more with extra `sie run` arguments (rows `compare/all/…`): a switch on vs off,
e.g. `--compare-arg=--metrics-enabled --compare-arg=false`.
The servers run in their own processes, the load generator in this one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import RunStats, build_request, run_load  # noqa: E402
from raw_ort import SENTENCES, feeds_for, load_graphs, make_session, sentences_per_second  # noqa: E402
from topology import HOST, Topology  # noqa: E402


def encode_requests(url: str, model: str, count: int, per_request: int) -> list[bytes]:
    """`count` requests rotating through the benchmark sentences (each distinct request built once)."""
    port = int(url.rsplit(":", 1)[1])
    path = f"/v1/encode/{model}"
    distinct = [
        build_request(
            HOST, port, path, {"items": [{"text": SENTENCES[(i + j) % len(SENTENCES)]} for j in range(per_request)]}
        )
        for i in range(min(count, len(SENTENCES)))
    ]
    return [distinct[i % len(distinct)] for i in range(count)]


WARM_UP_S = 0.5
# Requests built per connection: more than any client sends in a scenario (they stop at the deadline).
_REQUESTS_PER_SECOND_BOUND = 400


def _steady(url: str, connections: list[list[bytes]], per_request: int, seconds: float) -> RunStats:
    """Warm up, then every connection sends until `seconds` have passed; the stats of the second part."""
    port = int(url.rsplit(":", 1)[1])
    asyncio.run(run_load(HOST, port, connections, per_request, WARM_UP_S))
    return asyncio.run(run_load(HOST, port, connections, per_request, seconds))


def model_scenarios(url: str, model: str, clients: int, seconds: float) -> dict[str, RunStats]:
    count = int(seconds * _REQUESTS_PER_SECOND_BOUND)
    concurrent = [encode_requests(url, model, count, 1) for _ in range(clients)]
    batched = [encode_requests(url, model, count, 32)]
    sequential = [encode_requests(url, model, count, 1)]
    return {
        f"{clients} clients x 1 sentence": _steady(url, concurrent, 1, seconds),
        "1 client x batch of 32": _steady(url, batched, 32, seconds),
        "sequential single sentences": _steady(url, sequential, 1, seconds),
    }


def null_scenarios(url: str, model: str, clients: int, seconds: float) -> dict[str, RunStats]:
    count = int(seconds * _REQUESTS_PER_SECOND_BOUND)
    wide = [encode_requests(url, model, count, 32) for _ in range(clients)]
    single = [encode_requests(url, model, count, 1) for _ in range(clients)]
    return {
        f"{clients} clients x 32 items (null backend)": _steady(url, wide, 32, seconds),
        f"{clients} clients x 1 item (null backend)": _steady(url, single, 1, seconds),
    }


def ceilings(graph: Path, tokenizer, seconds: float) -> dict[str, float]:
    best32 = 0.0
    for threads in (1, 2):
        session = make_session(graph, threads)
        best32 = max(best32, sentences_per_second(session, feeds_for(session, tokenizer, 32), seconds))
    session = make_session(graph, 1)
    single = sentences_per_second(session, feeds_for(session, tokenizer, 1), seconds)
    return {"raw ORT batch 32": best32, "raw ORT batch 1": single}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def report(rounds: list[dict]) -> None:
    ceiling = statistics.median(r["raw ORT batch 32"] for r in rounds)
    model_ms = 1000.0 / statistics.median(r["raw ORT batch 1"] for r in rounds)
    print(f"medians of {len(rounds)} interleaved rounds; ceiling = raw onnxruntime batch 32 = {ceiling:,.0f} sent/s")
    print(f"model's own single-sentence time (raw ORT batch 1): {model_ms:.2f} ms")
    print("| scenario | items/s | ratio to ceiling | p50 ms | p95 ms | failures |")
    print("|---|---|---|---|---|---|")
    for name in rounds[0]:
        if name.startswith("raw"):
            rate = statistics.median(r[name] for r in rounds)
            print(f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} | | | |")
            continue
        stats = [r[name] for r in rounds]
        rate = statistics.median(s.sentences / s.wall_s for s in stats)
        p50 = statistics.median(percentile(s.latencies, 0.5) for s in stats) * 1000
        p95 = statistics.median(percentile(s.latencies, 0.95) for s in stats) * 1000
        failures = sum(s.failures for s in stats)
        print(f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} | {p50:.1f} | {p95:.1f} | {failures} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--mode", choices=("all", "distributed", "both"), default="both")
    parser.add_argument("--backend", choices=("onnx", "null"), default="onnx")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--load-seconds", type=float, default=3.0, help="steady-state time per HTTP scenario")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per raw onnxruntime measurement")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `sie run` argument (repeatable)")
    parser.add_argument(
        "--compare-src",
        type=Path,
        help="`src/` of another checkout whose `all` topology runs beside this one's (rows `before/…`)",
    )
    parser.add_argument(
        "--compare-arg",
        action="append",
        default=[],
        help="extra `sie run` argument of a second `all` topology of this checkout (rows `compare/…`; repeatable)",
    )
    parser.add_argument(
        "--http-server",
        default="hypercorn,uvicorn",
        help="SIE_HTTP_SERVER of the topologies: hypercorn, uvicorn, or both comma-separated (default both)",
    )
    args = parser.parse_args(argv)
    servers = [name.strip() for name in args.http_server.split(",") if name.strip()]
    if not servers or not set(servers) <= {"hypercorn", "uvicorn"}:
        parser.error("--http-server takes hypercorn, uvicorn or both, comma-separated")
    ((graph, tokenizer),) = load_graphs([args.model]).values()
    kinds = ("all", "distributed") if args.mode == "both" else (args.mode,)
    topologies = [
        Topology(kind, args.model, args.backend, args.server_arg, server) for kind in kinds for server in servers
    ]
    if args.compare_src is not None:
        source = args.compare_src.resolve()
        topologies += [Topology("all", args.model, args.backend, args.server_arg, server, source) for server in servers]
    compared = [
        Topology("all", args.model, args.backend, [*args.server_arg, *args.compare_arg], server)
        for server in servers
        if args.compare_arg
    ]
    topologies += compared
    scenarios = null_scenarios if args.backend == "null" else model_scenarios
    try:
        for topology in topologies:
            topology.wait_serving(args.model)
        rounds = []
        for index in range(args.rounds):
            print(f"round {index + 1}/{args.rounds}", file=sys.stderr)
            measured: dict = dict(ceilings(graph, tokenizer, args.seconds))
            # Each round starts with another topology, so a slow spell on the shared machine hits them alike.
            shift = index % len(topologies)
            for topology in topologies[shift:] + topologies[:shift]:
                runs = scenarios(topology.url, args.model, args.clients, args.load_seconds)
                label = topology.kind if len(servers) == 1 else f"{topology.kind}/{topology.http_server}"
                if topology.source is not None:
                    label = f"before/{label}"
                if topology in compared:
                    label = f"compare/{label}"
                measured.update({f"{label}: {name}": stats for name, stats in runs.items()})
            rounds.append(measured)
        report(rounds)
    finally:
        for topology in topologies:
            topology.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
