"""CPU per request of the serving path, by variant: what each feature costs, in microseconds of server CPU.

    .venv/bin/python scripts/bench/request_cost.py [--rounds 3] [--mode all|distributed] [--clients 32]
        [--backend null|onnx] [--variant NAME=ARG,ARG ...] [--compare-ref REF]

Each variant is a topology (`scripts/bench/topology.py`) with the null backend (the worker runs no model), so all of
the CPU the server spends is path: HTTP, routing, queue, sidecar, IPC, telemetry. With `--backend onnx` the model
runs (its CPU is in every figure alike): the path then meets what only a loaded server shows — requests that wait
~0.1 s behind a batch (a disconnect watcher each, before b89b06f), batches that alternate in size. `wrk` (about 1 %
of a core) sends `--clients` keep-alive connections × 1 item for `--load-seconds`; the CPU time of every process of
the topology (user + system, from /proc, children included) is read before and after, and divided by the requests
answered. Unlike a throughput figure this is nearly independent of what else the shared machine runs, so a 30 µs
difference shows. Variants are interleaved over `--rounds`; the table gives medians and the difference to the first
variant (`default`: no extra arguments).

`--variant NAME=ARG,ARG` adds this checkout's topology with extra `sie run` arguments, e.g.
`--variant metrics-off=--metrics-enabled,false --variant quiet=--log-level,warning`; `--compare-ref REF` adds the
same default topology of commit REF (a worktree under .cache/bench, see serve.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import checkout_of, encode_bodies  # noqa: E402
from topology import Topology  # noqa: E402
from wrk import run_wrk, wrk_binary  # noqa: E402

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` and of every descendant still running (and the reaped ones'
    totals, which /proc adds to their parent's cutime/cstime)."""
    total = 0.0
    pending = list(pids)
    while pending:
        pid = pending.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        # After the ")": state ppid ... utime(12) stime(13) cutime(14) cstime(15), 0-based from state.
        total += sum(int(value) for value in fields[11:15]) / _TICKS_PER_SECOND
        pending.extend(_children(pid))
    return total


def measure(topology: Topology, model: str, clients: int, seconds: int) -> tuple[float, int]:
    """(server CPU µs per answered request, failures)."""
    path = f"/v1/encode/{model}"
    bodies = encode_bodies(1)
    run_wrk(topology.url, path, bodies, clients, 1, 1)
    pids = topology.pids()
    before = cpu_seconds(pids)
    stats = run_wrk(topology.url, path, bodies, clients, seconds, 1)
    spent = cpu_seconds(pids) - before
    answered = stats.requests - stats.status_errors
    return (spent / answered * 1e6 if answered else float("nan")), stats.failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--mode", choices=("all", "distributed"), default="all")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--load-seconds", type=int, default=4)
    parser.add_argument("--http-server", choices=("hypercorn", "uvicorn"), default="uvicorn")
    parser.add_argument("--backend", choices=("null", "onnx"), default="null", help="the worker's backend")
    parser.add_argument("--variant", action="append", default=[], help="NAME=ARG,ARG: extra `sie run` arguments")
    parser.add_argument("--compare-ref", help="a commit whose default topology runs beside (row REF)")
    args = parser.parse_args(argv)
    wrk_binary()
    variants: dict[str, Topology] = {
        "default": Topology(args.mode, args.model, args.backend, [], args.http_server),
    }
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        if not name or not extra:
            parser.error(f"--variant takes NAME=ARG,ARG, not {spec!r}")
        variants[name] = Topology(args.mode, args.model, args.backend, extra.split(","), args.http_server)
    if args.compare_ref:
        source = checkout_of(args.compare_ref)
        variants[args.compare_ref] = Topology(args.mode, args.model, args.backend, [], args.http_server, source)
    names = list(variants)
    results: dict[str, list[float]] = {name: [] for name in names}
    failures = dict.fromkeys(names, 0)
    try:
        for topology in variants.values():
            topology.wait_serving(args.model)
        for index in range(args.rounds):
            print(f"round {index + 1}/{args.rounds}", file=sys.stderr)
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                cost, failed = measure(variants[name], args.model, args.clients, args.load_seconds)
                results[name].append(cost)
                failures[name] += failed
    finally:
        for topology in variants.values():
            topology.stop()
    base = statistics.median(results["default"])
    print(
        f"server CPU per request, {args.mode}/{args.http_server}, {args.backend} backend, {args.clients} connections "
        "x 1 item, "
        f"medians of {args.rounds} interleaved rounds"
    )
    print("| variant | CPU µs/request | vs default | rounds | failures |")
    print("|---|---|---|---|---|")
    for name in names:
        median = statistics.median(results[name])
        rounds = " ".join(f"{value:.0f}" for value in results[name])
        print(f"| {name} | {median:.0f} | {median - base:+.0f} | {rounds} | {failures[name]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
