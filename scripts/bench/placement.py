"""Placement modes on a simulated pod: one seeded trace, every mode, one table (seed 002 "Scheduling modes").

8 models with Zipf-like arrival shares and unequal costs per item share 4 simulated devices. Each device
keeps a queue per model and runs one batch at a time: when free it takes the model whose oldest request
waited longest and coalesces up to max batch of its queued items (batch time = overhead + items × cost).
Requests carry one item each and are routed by `Placement.choose` when they arrive, among the children
`Placement.assigned` names; `started` at arrival, `finished` when the batch ends, charged its share of the
batch's device time. Every probe interval the devices report compute totals, measured costs and memory.
A moved model is ready on its new device at once (no load time is simulated).

Reading the fill row: a device busy all the time spends busy time = batches × overhead + item work, the
same for every mode, so at 100 % busy every mode makes the same number of batches. Mean fill can only
differ where a mode leaves devices idle; `--scan` shows how the ratio and the queueing delay move with load.

    .venv/bin/python scripts/bench/placement.py [--seed 1] [--requests 40000] [--load 0.2] [--scan 0.1,0.2,0.4]
"""

from __future__ import annotations

import argparse
import heapq
import random
import shlex
import statistics
import sys
from collections import deque

import attrs

from sie.placement.ledger import Ticket
from sie.placement.policy import PlacementPolicy
from sie.placement.reports import ChildReport, ModelReport
from sie.placement.router import Placement

DEVICES = tuple(f"worker-{i}" for i in range(4))
MAX_BATCH = 32
OVERHEAD_S = 0.004
COSTS_PER_ITEM_S = (0.0006, 0.0015, 0.0004, 0.0010, 0.0020, 0.0008, 0.0012, 0.0005)
GB = 1 << 30
MEMORY_BUDGET = 8 * GB
PROBE_INTERVAL_S = 0.5


@attrs.frozen
class Trace:
    """Arrival times and models of single-item requests, and the models' costs and resident sizes."""

    arrivals: tuple[tuple[float, str], ...]
    costs: dict[str, float]
    memory: dict[str, int]
    shares: dict[str, float]


def make_trace(seed: int, requests: int, load: float, skew: float) -> Trace:
    """Poisson arrivals whose item work (no overhead) keeps the devices `load` busy."""
    rng = random.Random(seed)
    names = [f"model-{chr(ord('a') + i)}" for i in range(len(COSTS_PER_ITEM_S))]
    weights = [1.0 / (rank + 1) ** skew for rank in range(len(names))]
    shares = {name: weight / sum(weights) for name, weight in zip(names, weights, strict=True)}
    costs = dict(zip(names, rng.sample(COSTS_PER_ITEM_S, len(COSTS_PER_ITEM_S)), strict=True))
    memory = {name: rng.choice((1, 2, 3)) * GB for name in names}
    mean_cost = sum(shares[name] * costs[name] for name in names)
    rate = load * len(DEVICES) / mean_cost
    now, arrivals = 0.0, []
    for _ in range(requests):
        now += rng.expovariate(rate)
        arrivals.append((now, rng.choices(names, weights=[shares[name] for name in names])[0]))
    return Trace(tuple(arrivals), costs, memory, shares)


@attrs.define
class Request:
    arrived: float
    model_id: str
    ticket: Ticket


@attrs.define
class Device:
    """One simulated device: a queue per model, the batch running, and what it measured."""

    name: str
    queues: dict[str, deque[Request]] = attrs.Factory(dict)
    running: list[Request] | None = None
    compute_total: float = 0.0
    measured: dict[str, tuple[float, int]] = attrs.Factory(dict)  # model -> (seconds, items)

    def next_batch(self) -> list[Request] | None:
        waiting = [queue for queue in self.queues.values() if queue]
        if not waiting:
            return None
        oldest = min(waiting, key=lambda queue: queue[0].arrived)
        return [oldest.popleft() for _ in range(min(MAX_BATCH, len(oldest)))]


@attrs.define
class Stats:
    """What one run measured after the warm-up."""

    fills: list[float] = attrs.Factory(list)
    delays: list[float] = attrs.Factory(list)
    compute: dict[str, float] = attrs.Factory(dict)
    repacks: int = 0
    span: float = 0.0


class Simulation:
    """Runs one trace under one policy."""

    def __init__(self, trace: Trace, policy: PlacementPolicy, warmup_until: float) -> None:
        self.trace = trace
        self.now = 0.0
        self.placement = Placement(policy, clock=lambda: self.now, wall_clock=lambda: self.now)
        self.devices = {name: Device(name) for name in DEVICES}
        self.events: list[tuple[float, int, str]] = []  # (finish time, sequence, device)
        self.warmup_until = warmup_until
        self.stats = Stats(compute=dict.fromkeys(DEVICES, 0.0))
        self._sequence = 0

    def run(self) -> Stats:
        self.probe()
        next_probe = PROBE_INTERVAL_S
        for arrived, model_id in self.trace.arrivals:
            while self.events and self.events[0][0] <= arrived or next_probe <= arrived:
                if self.events and self.events[0][0] <= next_probe:
                    self.now, _, name = heapq.heappop(self.events)
                    self.complete(self.devices[name])
                else:
                    self.now, next_probe = next_probe, next_probe + PROBE_INTERVAL_S
                    self.probe()
            self.now = arrived
            self.arrive(model_id)
        while self.events:
            self.now, _, name = heapq.heappop(self.events)
            self.complete(self.devices[name])
        self.stats.span = self.now - self.warmup_until
        self.stats.repacks = sum(count for trigger, count in self.placement.snapshot().repacks_total)
        return self.stats

    def arrive(self, model_id: str) -> None:
        child = self.placement.choose(model_id, 1, self.placement.assigned(model_id))
        if child is None:
            raise RuntimeError(f"no child for {model_id}")
        ticket = self.placement.started(child, model_id, 1)
        device = self.devices[child]
        device.queues.setdefault(model_id, deque()).append(Request(self.now, model_id, ticket))
        if device.running is None:
            self.start(device)

    def start(self, device: Device) -> None:
        batch = device.next_batch()
        device.running = batch
        if batch is None:
            return
        model_id = batch[0].model_id
        duration = OVERHEAD_S + len(batch) * self.trace.costs[model_id]
        if self.now >= self.warmup_until:
            self.stats.fills.append(len(batch) / MAX_BATCH)
            self.stats.delays.extend(self.now - request.arrived for request in batch)
            self.stats.compute[device.name] += duration
        self._sequence += 1
        heapq.heappush(self.events, (self.now + duration, self._sequence, device.name))

    def complete(self, device: Device) -> None:
        batch = device.running or []
        model_id = batch[0].model_id
        duration = OVERHEAD_S + len(batch) * self.trace.costs[model_id]
        device.compute_total += duration
        seconds, items = device.measured.get(model_id, (0.0, 0))
        device.measured[model_id] = (seconds + duration, items + len(batch))
        for request in batch:
            self.placement.finished(request.ticket, duration / len(batch))
        self.start(device)

    def probe(self) -> None:
        hosted = {model_id: set(self.placement.assigned(model_id)) for model_id in self.trace.costs}
        self.placement.update([self.report(device, hosted) for device in self.devices.values()])

    def report(self, device: Device, hosted: dict[str, set[str]]) -> ChildReport:
        models = {}
        for model_id, hosts in hosted.items():
            seconds, items = device.measured.get(model_id, (0.0, 0))
            cost = seconds / items if items else None
            models[model_id] = ModelReport(model_id, device.name in hosts, self.trace.memory[model_id], cost, MAX_BATCH)
        return ChildReport(device.name, "sim", True, device.compute_total, MEMORY_BUDGET, models)


def summarise(stats: Stats) -> dict[str, float]:
    compute = list(stats.compute.values())
    delays = sorted(stats.delays)
    return {
        "fill": statistics.fmean(stats.fills),
        "spread": (max(compute) - min(compute)) / statistics.fmean(compute),
        "p50": delays[len(delays) // 2] * 1000,
        "p99": delays[int(len(delays) * 0.99)] * 1000,
        "util": sum(compute) / (len(compute) * stats.span),
        "repacks": float(stats.repacks),
    }


def policies(trace: Trace, budget: float) -> dict[str, PlacementPolicy]:
    hot = max(trace.shares, key=lambda name: trace.shares[name])
    lpt = PlacementPolicy(
        mode="lpt_packing", rebalance_compute_seconds=budget, first_rebalance_compute_seconds=budget / 5
    )
    return {
        "round_robin": PlacementPolicy(mode="round_robin"),
        "least_outst.": PlacementPolicy(mode="least_outstanding", work_basis="compute"),
        "lpt r=1": lpt,
        "lpt hot×2": lpt.with_model(hot, replicas=2),
        "lpt hot×2 rr": lpt.with_model(hot, replicas=2).with_knobs({"routing_policy": "fill_rr"}),
    }


def print_table(results: dict[str, dict[str, float]]) -> None:
    rows = (
        ("mean batch fill", "fill", "{:.3f}"),
        ("compute spread", "spread", "{:.1%}"),
        ("p50 queue ms", "p50", "{:.1f}"),
        ("p99 queue ms", "p99", "{:.1f}"),
        ("utilisation", "util", "{:.1%}"),
        ("repacks", "repacks", "{:.0f}"),
    )
    print(f"{'':18}" + "".join(f"{name:>14}" for name in results))
    for label, key, form in rows:
        print(f"{label:18}" + "".join(f"{form.format(result[key]):>14}" for result in results.values()))
    base = results["round_robin"]["fill"]
    print(f"{'fill ÷ rr':18}" + "".join(f"{result['fill'] / base:>13.2f}×" for result in results.values()))


def describe(trace: Trace, budget: float) -> None:
    print(
        f"trace: {len(trace.arrivals)} requests over {trace.arrivals[-1][0]:.1f} s on {len(DEVICES)} devices, "
        f"max batch {MAX_BATCH}, overhead {OVERHEAD_S * 1000:.0f} ms/batch, repack budget {budget:.1f} device-s"
    )
    for name in sorted(trace.shares, key=lambda name: -trace.shares[name]):
        print(
            f"  {name}: {trace.shares[name]:.1%} of requests, {trace.costs[name] * 1000:.1f} ms/item, "
            f"{trace.memory[name] // GB} GB"
        )


def run_modes(args: argparse.Namespace, load: float, names: tuple[str, ...] | None = None) -> dict[str, dict]:
    """Every mode (or those named) on the same trace, measured after the warm-up."""
    trace = make_trace(args.seed, args.requests, load, args.skew)
    # Half the trace's item work: with the batch overhead that is about 8 repacks over the trace.
    budget = sum(trace.costs[model_id] for _, model_id in trace.arrivals) / 2
    if names is None:
        describe(trace, budget)
    warmup_until = trace.arrivals[int(len(trace.arrivals) * args.warmup)][0]
    chosen = {name: policy for name, policy in policies(trace, budget).items() if names is None or name in names}
    return {name: summarise(Simulation(trace, policy, warmup_until).run()) for name, policy in chosen.items()}


def print_verdicts(results: dict[str, dict[str, float]]) -> None:
    base = results["round_robin"]["fill"]
    for name, result in results.items():
        if name.startswith("lpt"):
            met = result["fill"] >= 1.5 * base and result["spread"] <= 0.10
            print(f"goal (fill >= 1.5× round_robin's, compute spread <= 10%) for {name}: {'met' if met else 'NOT met'}")


def print_scan(args: argparse.Namespace) -> None:
    """One line per load: round_robin against lpt_packing with the hot model on 2 replicas."""
    print(f"{'load':>6}{'rr util':>9}{'lpt util':>9}{'rr fill':>9}{'lpt fill':>9}{'ratio':>7}{'spread':>8}"
          f"{'rr p50':>8}{'lpt p50':>8}")  # fmt: skip
    for load in args.scan:
        results = run_modes(args, load, ("round_robin", "lpt hot×2"))
        rr, lpt = results["round_robin"], results["lpt hot×2"]
        print(
            f"{load:>6.2f}{rr['util']:>9.1%}{lpt['util']:>9.1%}{rr['fill']:>9.3f}{lpt['fill']:>9.3f}"
            f"{lpt['fill'] / rr['fill']:>6.2f}×{lpt['spread']:>8.1%}{rr['p50']:>8.1f}{lpt['p50']:>8.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--load", type=float, default=0.2, help="item work (no overhead) per device, 0..1")
    parser.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of the arrival shares")
    parser.add_argument("--warmup", type=float, default=0.1, help="fraction of the trace not measured")
    parser.add_argument("--scan", type=lambda text: [float(x) for x in text.split(",")], help="loads, e.g. 0.1,0.2")
    args = parser.parse_args(argv)
    print("command:", shlex.join(["python", "scripts/bench/placement.py", *(sys.argv[1:] if argv is None else argv)]))
    if args.scan:
        print_scan(args)
        return 0
    results = run_modes(args, args.load)
    print(f"measured after the first {args.warmup:.0%} of the trace")
    print_table(results)
    print_verdicts(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
