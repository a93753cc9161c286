"""Serving overhead, measured side by side in one run: raw onnxruntime (the ceiling) against
`sie run --role all` over HTTP, interleaved for `--rounds` rounds, medians printed with ratios.

    .venv/bin/python scripts/bench/serve.py [--rounds 3] [--model ID] [--clients 32]

Scenarios per round: the raw in-process ceiling at batch 32 (best of 1 and 2 intra-op threads) and
at batch 1; 32 concurrent clients × 1 sentence per request; 1 client × batches of 32; sequential
single sentences (p50/p95). The server runs in its own process, the load generator in this one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadgen import RunStats, build_request, run_load  # noqa: E402
from raw_ort import SENTENCES, feeds_for, load_graphs, make_session, sentences_per_second  # noqa: E402

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_server(port: int, model: str, extra: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "sie.cli.main", "run", "--role", "all", "--host", HOST, "--port", str(port)]
    command += ["--preload", model, *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))


def wait_ready(port: int, model: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    body = {"items": [{"text": "warm up"}]}
    while time.monotonic() < deadline:
        try:
            response = httpx.post(f"http://{HOST}:{port}/v1/encode/{model}", json=body, timeout=30)
            if response.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)  # polling the server's readiness with a deadline
    raise SystemExit("server did not become ready")


def encode_requests(port: int, model: str, count: int, per_request: int) -> list[bytes]:
    path = f"/v1/encode/{model}"
    return [
        build_request(
            HOST, port, path, {"items": [{"text": SENTENCES[(i + j) % len(SENTENCES)]} for j in range(per_request)]}
        )
        for i in range(count)
    ]


def http_scenarios(port: int, model: str, clients: int, requests_per_client: int) -> dict[str, RunStats]:
    concurrent = [encode_requests(port, model, requests_per_client, 1) for _ in range(clients)]
    batched = [encode_requests(port, model, max(8, requests_per_client // 2), 32)]
    sequential = [encode_requests(port, model, 4 * requests_per_client, 1)]
    return {
        f"{clients} clients x 1 sentence": asyncio.run(run_load(HOST, port, concurrent, 1, 60)),
        "1 client x batch of 32": asyncio.run(run_load(HOST, port, batched, 32, 60)),
        "sequential single sentences": asyncio.run(run_load(HOST, port, sequential, 1, 60)),
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
    print("| scenario | sentences/s | ratio to ceiling | p50 ms | p95 ms | failures |")
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
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests-per-client", type=int, default=25)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per raw onnxruntime measurement")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `sie run` argument (repeatable)")
    args = parser.parse_args(argv)
    ((graph, tokenizer),) = load_graphs([args.model]).values()
    port = free_port()
    server = start_server(port, args.model, args.server_arg)
    try:
        wait_ready(port, args.model)
        rounds = []
        for index in range(args.rounds):
            print(f"round {index + 1}/{args.rounds}", file=sys.stderr)
            measured: dict = dict(ceilings(graph, tokenizer, args.seconds))
            measured.update(http_scenarios(port, args.model, args.clients, args.requests_per_client))
            rounds.append(measured)
        report(rounds)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
