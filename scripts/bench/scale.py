"""How the distributed path scales (issue 33), measured on this machine with the null backend (no model runs), wrk
as the load generator (about 1 % of a core), and every process's CPU read from /proc around each run.

    .venv/bin/python scripts/bench/scale.py                                # both measurements
    .venv/bin/python scripts/bench/scale.py --only gateway --rounds 3
    .venv/bin/python scripts/bench/scale.py --only lane --sidecars 1 2 4 8 --item-time-ms 8

1. `gateway`: one gateway, nats-server and two sidecar + null worker pairs answering at once; wrk sends encode
   requests of `--items` texts over `--connections` connections. Printed: items/s, and the CPU each kind of process
   spent per item (gateway, nats-server, sidecars, workers) with nats-server's messages per item (`/varz`); items per
   gateway CPU-second is what one gateway core carries (the goal: >= 5,000). `--nats-nodes 3`: the same on a
   three-node JetStream cluster, streams replicated three times on disk.
2. `lane`: `max(--sidecars)` pairs on one lane, each null worker taking `--item-time-ms` per item, one batch at a
   time (a device's stand-in, waited without a CPU), so sidecars scale past the two cores; the pairs are stopped
   down to each count in turn (largest first). Printed per count: items/s, and its ratio to count × the one-sidecar
   figure (the goal: >= 0.9 at 8). Load keeps every sidecar busy: `--per-sidecar` connections per sidecar.

Medians of `--rounds` runs per row. docs/scaling.md turns these figures into the projection to 1,000 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx
from wrk import WrkStats, run_wrk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher import Cluster, part_name  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
PATH = f"/v1/encode/{MODEL}"
TICKS = os.sysconf("SC_CLK_TCK")
KINDS = ("gateway", "nats", "sidecar", "worker")


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) `pid` and its live descendants have used."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        child = int(entry.name)
        children.setdefault(int(fields[1]), []).append(child)
        times[child] = (int(fields[11]) + int(fields[12])) / TICKS
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += times.get(current, 0.0)
        stack.extend(children.get(current, []))
    return total


@attrs.frozen
class Run:
    """One wrk run: what it counted, the CPU seconds each kind of process used, nats-server's messages in + out."""

    stats: WrkStats
    cpu_s: dict[str, float]
    nats_messages: int
    node_cpu_s: dict[int, float]  # each nats node's CPU seconds, by node

    @property
    def items(self) -> int:
        return (self.stats.requests - self.stats.status_errors) * self.stats.items_per_request

    def per_item_us(self, kind: str) -> float:
        return self.cpu_s[kind] / max(1, self.items) * 1e6


def _pids(cluster: Cluster) -> dict[str, list[int]]:
    pids: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for part, process in cluster.roles.items():
        if process.returncode is None:
            pids[part.split("-", 1)[0]].append(process.pid)
    pids["nats"] = [node.process.pid for node in cluster.brokers.nodes.values() if node.process.poll() is None]
    return pids


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    return {kind: sum(process_tree_cpu_s(pid) for pid in group) for kind, group in pids.items()}


def _nats_messages(cluster: Cluster) -> int:
    total = 0
    for url in cluster.brokers.monitor_urls:
        varz = httpx.get(f"{url}/varz", timeout=5).json()
        total += varz["in_msgs"] + varz["out_msgs"]
    return total


def measure(cluster: Cluster, items: int, connections: int, seconds: int) -> Run:
    """One wrk run against the first gateway, with every process's CPU and nats-server's message count around it."""
    bodies = [
        json.dumps({"items": [{"text": f"request {index} item {item}"} for item in range(items)]}).encode()
        for index in range(16)
    ]
    pids = _pids(cluster)
    nodes = {index: node.process.pid for index, node in cluster.brokers.nodes.items()}
    cpu_before, messages_before = _cpu(pids), _nats_messages(cluster)
    nodes_before = {index: process_tree_cpu_s(pid) for index, pid in nodes.items()}
    stats = run_wrk(cluster.url, PATH, bodies, connections, seconds, items)
    cpu_after, messages_after = _cpu(pids), _nats_messages(cluster)
    node_cpu = {index: process_tree_cpu_s(pid) - nodes_before[index] for index, pid in nodes.items()}
    if stats.failures:
        raise RuntimeError(f"{stats.failures} failed requests of {stats.requests}; logs in {cluster.root}")
    cpu = {kind: cpu_after[kind] - cpu_before[kind] for kind in KINDS}
    return Run(stats, cpu, messages_after - messages_before, node_cpu)


@contextmanager
def null_cluster(
    pairs: int, item_time_ms: float, nats_nodes: int = 1, max_pending: int | None = None
) -> Iterator[Cluster]:
    """`pairs` null pairs and one gateway; with `nats_nodes` > 1 a JetStream cluster with streams replicated on every
    node, stored on disk (what a production cluster runs); `max_pending` is each sidecar's SIE_MAX_CONCURRENT_REQUESTS
    (the items it holds at once; the rest stay in the stream for the other sidecars)."""
    root = Path(tempfile.mkdtemp(prefix="sie-scale-"))
    worker_args = ["--backend", "null", "--null-item-time-ms", f"{item_time_ms:g}"]
    broker = {"SIE_STREAM_REPLICAS": str(nats_nodes), "SIE_STREAM_STORAGE": "file" if nats_nodes > 1 else "memory"}
    if max_pending is not None:
        broker["SIE_MAX_CONCURRENT_REQUESTS"] = str(max_pending)
    cluster = Cluster(
        root, worker_args, model=MODEL, pairs=pairs, gateway_timeout_s=60.0, nats_nodes=nats_nodes, broker_env=broker
    )
    try:
        cluster.wait_serving()
        _wait_registered(cluster, pairs)
        yield cluster
    finally:
        cluster.close()


def _wait_registered(cluster: Cluster, pairs: int, timeout_s: float = 120.0) -> None:
    """Until the gateway has heard every pair's worker (its /health lists them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = httpx.get(f"{cluster.url}/health", timeout=5).json().get("workers") or []
        if len(workers) >= pairs:
            return
        time.sleep(0.2)  # a bounded poll of the gateway's registry
    raise TimeoutError(f"the gateway heard fewer than {pairs} workers in {timeout_s} s; logs in {cluster.root}")


def gateway_cost(args: argparse.Namespace) -> None:
    broker = (
        "1 nats-server (memory)" if args.nats_nodes == 1 else f"{args.nats_nodes} nats nodes (R{args.nats_nodes}, file)"
    )
    print(f"\n== gateway cost: 1 gateway, 2 null pairs, {broker}, {args.connections} connections x {args.items} "
          f"items, {args.seconds} s x {args.rounds} rounds (medians)")  # fmt: skip
    with null_cluster(2, 0.0, args.nats_nodes) as cluster:
        measure(cluster, args.items, args.connections, 2)  # warm-up
        runs = [measure(cluster, args.items, args.connections, args.seconds) for _ in range(args.rounds)]
        leader = cluster.brokers.stream_leader("WORK_POOL_default")
    items_per_s = statistics.median(run.items / run.stats.duration_s for run in runs)
    gateway_items_per_cpu_s = statistics.median(run.items / max(run.cpu_s["gateway"], 1e-9) for run in runs)
    print(f"items/s {items_per_s:,.0f}   p50 {statistics.median(r.stats.p50_s for r in runs) * 1e3:.1f} ms")
    print(f"items per gateway CPU-second: {gateway_items_per_cpu_s:,.0f} (goal >= 5,000)")
    for kind in KINDS:
        print(f"  CPU per item, {kind:<8} {statistics.median(run.per_item_us(kind) for run in runs):7.1f} us")
    messages = statistics.median(run.nats_messages / max(1, run.items) for run in runs)
    print(f"  nats-server messages (in + out) per item: {messages:.2f}")
    if args.nats_nodes > 1:
        for node in sorted(runs[0].node_cpu_s):
            share = statistics.median(run.node_cpu_s[node] / max(1, run.items) * 1e6 for run in runs)
            role = " (leads WORK_POOL_default)" if node == leader else ""
            print(f"  CPU per item, nats node {node}: {share:.1f} us{role}")


def lane_scaling(args: argparse.Namespace) -> None:
    counts = sorted(set(args.sidecars), reverse=True)
    print(f"\n== lane scaling: null workers at {args.item_time_ms:g} ms per item (one batch at a time), "
          f"{args.per_sidecar} connections per sidecar x {args.items} items, "
          f"max pending {args.max_pending or 'default'}, {args.seconds} s x {args.rounds} rounds")  # fmt: skip
    rates: dict[int, float] = {}
    with null_cluster(counts[0], args.item_time_ms, max_pending=args.max_pending) as cluster:
        for count in counts:
            for index in range(count + 1, counts[0] + 1):  # the pairs above `count` are stopped
                for role in ("sidecar", "worker"):
                    part = part_name(role, index)
                    if cluster.roles[part].returncode is None:
                        cluster.stop(part)
            time.sleep(1.0)  # the stopped sidecars' last batches settle
            connections = args.per_sidecar * count
            measure(cluster, args.items, connections, 2)  # warm-up at this size
            runs = [measure(cluster, args.items, connections, args.seconds) for _ in range(args.rounds)]
            rates[count] = statistics.median(run.items / run.stats.duration_s for run in runs)
            cpu = {kind: statistics.median(run.per_item_us(kind) for run in runs) for kind in KINDS}
            print(f"sidecars {count}: {rates[count]:8,.0f} items/s   CPU/item gateway {cpu['gateway']:.0f} us, "
                  f"nats {cpu['nats']:.0f} us, sidecars {cpu['sidecar']:.0f} us", flush=True)  # fmt: skip
    base = rates.get(1)
    if base:
        print(f"{'sidecars':>8} {'items/s':>9} {'linear':>9} {'ratio':>6}")
        for count in sorted(rates):
            print(f"{count:>8} {rates[count]:>9,.0f} {count * base:>9,.0f} {rates[count] / (count * base):>6.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("gateway", "lane"), help="run one of the two measurements")
    parser.add_argument("--rounds", type=int, default=3, help="runs per row; medians printed (default 3)")
    parser.add_argument("--seconds", type=int, default=8, help="wrk seconds per run (default 8)")
    parser.add_argument("--items", type=int, default=8, help="texts per encode request (default 8)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections, gateway cost (default 32)")
    parser.add_argument("--nats-nodes", type=int, default=1, help="gateway cost: 3 for an R3 JetStream cluster")
    parser.add_argument("--sidecars", type=int, nargs="+", default=[1, 2, 4, 8], help="lane sizes (default 1 2 4 8)")
    parser.add_argument("--item-time-ms", type=float, default=8.0, help="null worker time per item (default 8)")
    parser.add_argument(
        "--max-pending", type=int, help="lane: each sidecar's SIE_MAX_CONCURRENT_REQUESTS (default: the setting's)"
    )
    parser.add_argument("--per-sidecar", type=int, default=8, help="wrk connections per sidecar, lane (default 8)")
    args = parser.parse_args(argv)
    if args.only in (None, "gateway"):
        gateway_cost(args)
    if args.only in (None, "lane"):
        lane_scaling(args)


if __name__ == "__main__":
    main()
