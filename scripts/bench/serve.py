"""Serving overhead, measured side by side in one run: raw onnxruntime (the ceiling) against the
`all` and `distributed` topologies over HTTP, interleaved for `--rounds` rounds, medians with ratios.

    .venv/bin/python scripts/bench/serve.py [--rounds 3] [--mode all|distributed|both] [--backend onnx|null]
        [--http-server hypercorn|uvicorn|hypercorn,uvicorn] [--compare-ref REF | --compare-src OTHER/src] [--words N]

The HTTP load comes from `wrk` (Debian package; `make bench-tools` installs it): about 1 % of a core, so the
server keeps the machine's CPU. Per round: the raw in-process ceiling, tokenizer included (tokenize, pad, run:
the least a server does), at batch 32 and at batch 1 (its p50 is the model's own single-sentence time), each the
best of 1 and 2 intra-op threads; then per topology: 32 keep-alive connections × 1 sentence per request, 1 connection ×
batches of 32, 1 connection × single sentences (p50/p95: the sequential latency). Each scenario runs 1 s of
warm-up, then `--load-seconds` measured.
With `--backend null` the worker runs no model and the table shows the items/s the gateway → queue →
sidecar → IPC path carries (32 clients × 32 items, 32 clients × 1 item).
Each topology runs once per `--http-server` (default both: rows `all/hypercorn: …`, `all/uvicorn: …`).
`--compare-ref REF` checks the commit REF out in a worktree (`.cache/bench/ref-SHA`, kept for the next run) and
runs its topologies (rows `REF/…`) interleaved with this checkout's in the same rounds: a before/after comparison
on one machine at one time; `--compare-src` does the same with another checkout's `src/` (rows `before/…`).
Both run with this checkout's virtual environment. `--compare-arg` (repeatable) adds this checkout's `all`
topology once more with extra `sie run` arguments (rows `compare/all/…`): a switch on vs off, e.g.
`--compare-arg=--metrics-enabled --compare-arg=false`. Each round starts with another topology, so a slow spell
on the shared machine hits them alike. `--words N` sends texts of N words (the benchmark sentences' words in turn)
instead of the sentences, to the raw ceiling and to the server alike: batches whose run memory passes the worker's
trim threshold (120 words on a MiniLM: 32 x ~130 tokens).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_ort import SENTENCES, load_graphs, make_session, tokenized_runs  # noqa: E402
from topology import Topology  # noqa: E402
from wrk import WrkStats, run_wrk, wrk_binary  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WARM_UP_S = 1


def benchmark_texts(words: int) -> list[str]:
    """The benchmark sentences, or (`words` > 0) as many texts of `words` words, each starting one word further into
    the sentences' words."""
    if words <= 0:
        return list(SENTENCES)
    vocabulary = " ".join(SENTENCES).split()
    starts = range(len(SENTENCES))
    return [" ".join(vocabulary[(start + k) % len(vocabulary)] for k in range(words)) for start in starts]


def encode_bodies(per_request: int, texts: Sequence[str] = SENTENCES) -> list[bytes]:
    """One JSON body per rotation of `texts` (the benchmark sentences), `per_request` items each."""
    return [
        orjson.dumps({"items": [{"text": texts[(i + j) % len(texts)]} for j in range(per_request)]})
        for i in range(len(texts))
    ]


def _steady(url: str, model: str, per_request: int, connections: int, seconds: int, texts: Sequence[str]) -> WrkStats:
    """Warm up, then measure: wrk's counts of the second part."""
    path = f"/v1/encode/{model}"
    bodies = encode_bodies(per_request, texts)
    run_wrk(url, path, bodies, connections, WARM_UP_S, per_request)
    return run_wrk(url, path, bodies, connections, seconds, per_request)


def model_scenarios(url: str, model: str, clients: int, seconds: int, texts: Sequence[str]) -> dict[str, WrkStats]:
    return {
        f"{clients} clients x 1 sentence": _steady(url, model, 1, clients, seconds, texts),
        "1 client x batch of 32": _steady(url, model, 32, 1, seconds, texts),
        "sequential single sentences": _steady(url, model, 1, 1, seconds, texts),
    }


def null_scenarios(url: str, model: str, clients: int, seconds: int, texts: Sequence[str]) -> dict[str, WrkStats]:
    return {
        f"{clients} clients x 32 items (null backend)": _steady(url, model, 32, clients, seconds, texts),
        f"{clients} clients x 1 item (null backend)": _steady(url, model, 1, clients, seconds, texts),
    }


def ceilings(graph: Path, tokenizer, seconds: float, texts: Sequence[str] = SENTENCES) -> dict[str, float]:
    """The raw figures, each the best of 1 and 2 intra-op threads (the server runs 2 on two cores)."""
    best32, best1, single_p50 = 0.0, 0.0, float("inf")
    for threads in (1, 2):
        session = make_session(graph, threads)
        best32 = max(best32, tokenized_runs(session, tokenizer, 32, seconds, texts)[0])
        rate, durations = tokenized_runs(session, tokenizer, 1, seconds, texts)
        best1, single_p50 = max(best1, rate), min(single_p50, statistics.median(durations))
    return {"raw ORT batch 32": best32, "raw ORT batch 1": best1, "raw ORT single p50": single_p50}


def report(rounds: list[dict]) -> None:
    ceiling = statistics.median(r["raw ORT batch 32"] for r in rounds)
    single_ms = statistics.median(r["raw ORT single p50"] for r in rounds) * 1000
    print(
        f"medians of {len(rounds)} interleaved rounds; ceiling = raw onnxruntime batch 32, tokenizer included = "
        f"{ceiling:,.0f} sent/s"
    )
    print(f"raw single sentence p50 (tokenize + run): {single_ms:.2f} ms")
    print("| scenario | items/s | ratio to ceiling | p50 ms | p50 − raw ms | p95 ms | failures |")
    print("|---|---|---|---|---|---|---|")
    for name in rounds[0]:
        if name == "raw ORT single p50":
            continue
        if name.startswith("raw"):
            rate = statistics.median(r[name] for r in rounds)
            print(f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} | | | | |")
            continue
        stats: list[WrkStats] = [r[name] for r in rounds]
        rate = statistics.median(s.items_per_second for s in stats)
        p50 = statistics.median(s.p50_s for s in stats) * 1000
        p95 = statistics.median(s.p95_s for s in stats) * 1000
        failures = sum(s.failures for s in stats)
        print(
            f"| {name} | {rate:,.0f} | {rate / ceiling:.2f} | {p50:.2f} | {p50 - single_ms:+.2f} | {p95:.2f} "
            f"| {failures} |"
        )


def checkout_of(ref: str) -> Path:
    """`src/` of a worktree of commit `ref` under .cache/bench (made once, kept), byte-compiled."""
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if sha.returncode != 0:
        raise SystemExit(f"--compare-ref: no commit {ref!r}: {sha.stderr.strip()}")
    directory = REPO / ".cache" / "bench" / f"ref-{sha.stdout.strip()[:12]}"
    if not (directory / "src").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=True)
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(directory), sha.stdout.strip()],
            check=True,
            capture_output=True,
        )
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(directory / "src")], check=True)
    return directory / "src"


def topologies_of(args: argparse.Namespace, servers: list[str]) -> list[tuple[str, Topology]]:
    """Every topology the options ask for, each with its row label."""
    kinds = ("all", "distributed") if args.mode == "both" else (args.mode,)

    def label(kind: str, server: str) -> str:
        return kind if len(servers) == 1 else f"{kind}/{server}"

    topologies = [
        (label(kind, server), Topology(kind, args.model, args.backend, args.server_arg, server))
        for kind in kinds
        for server in servers
    ]
    if args.compare_ref is not None or args.compare_src is not None:
        source = checkout_of(args.compare_ref) if args.compare_ref else args.compare_src.resolve()
        prefix = f"{args.compare_ref}/" if args.compare_ref else "before/"
        topologies += [
            (prefix + label(kind, server), Topology(kind, args.model, args.backend, args.server_arg, server, source))
            for kind in kinds
            for server in servers
        ]
    if args.compare_arg:
        extra = [*args.server_arg, *args.compare_arg]
        topologies += [
            ("compare/" + label("all", server), Topology("all", args.model, args.backend, extra, server))
            for server in servers
        ]
    return topologies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--mode", choices=("all", "distributed", "both"), default="both")
    parser.add_argument("--backend", choices=("onnx", "null"), default="onnx")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--load-seconds", type=int, default=3, help="measured seconds per HTTP scenario (whole)")
    parser.add_argument("--seconds", type=float, default=2.0, help="time per raw onnxruntime measurement")
    parser.add_argument("--server-arg", action="append", default=[], help="extra `sie run` argument (repeatable)")
    parser.add_argument("--words", type=int, default=0, help="texts of this many words instead of the sentences")
    compare = parser.add_mutually_exclusive_group()
    compare.add_argument("--compare-ref", help="a commit whose topologies run beside this checkout's (rows `REF/…`)")
    compare.add_argument(
        "--compare-src",
        type=Path,
        help="`src/` of another checkout whose topologies run beside this one's (rows `before/…`)",
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
    wrk_binary()
    ((graph, tokenizer),) = load_graphs([args.model]).values()
    labelled = topologies_of(args, servers)
    topologies = [topology for _, topology in labelled]
    labels = {id(topology): label for label, topology in labelled}
    scenarios = null_scenarios if args.backend == "null" else model_scenarios
    texts = benchmark_texts(args.words)
    try:
        for topology in topologies:
            topology.wait_serving(args.model)
        rounds = []
        for index in range(args.rounds):
            print(f"round {index + 1}/{args.rounds}", file=sys.stderr)
            measured: dict = dict(ceilings(graph, tokenizer, args.seconds, texts))
            shift = index % len(topologies)
            for topology in topologies[shift:] + topologies[:shift]:
                runs = scenarios(topology.url, args.model, args.clients, args.load_seconds, texts)
                measured.update({f"{labels[id(topology)]}: {name}": stats for name, stats in runs.items()})
            rounds.append(measured)
        report(rounds)
    finally:
        for topology in topologies:
            topology.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
