"""Placement modes on a simulated pod: one seeded trace, every mode, one table (seed 002 "Scheduling modes").

8 models with Zipf-like arrival shares and unequal costs per item share 4 simulated devices. Each device
keeps a queue per model and runs one batch at a time (batch time = overhead + items × cost, plus a switch
cost when the model differs from the device's previous batch). Requests carry one item each and are routed
by `Placement.choose` when they arrive, among the children `Placement.assigned` names; `started` at
arrival, `finished` when the batch ends, charged its share of the batch's device time. Every probe interval
the devices report compute totals, measured costs and memory. A moved model is ready on its new device at
once (no load time is simulated).

The device model. Seed 002 keeps coalescing at the worker, and real workers coalesce with a dynamic
batcher that holds a partial batch briefly: Triton's `max_queue_delay_microseconds`, our own sidecar's
SIE_MAX_BATCH_WAIT_MS (10 ms by default). The simulated device does the same: when it is free, a model
queue is ready when it holds max batch items or its oldest item has waited `--max-queue-delay-ms`; the
ready queue whose oldest item waited longest goes, and with none ready the device holds for the queue with
the oldest item until its deadline, starting at once should a queue reach max batch meanwhile. The default
5 ms is half our sidecar's default. `--switch-ms` (default 0.5 ms) is charged to a batch whose model
differs from the device's previous one: another graph's weights and kernels into caches. It is an
assumption, not a measurement; it lowers lpt_packing's fill ratio rather than raising it (round_robin's
devices are saturated either way). Queueing delay is arrival → batch start, so the hold counts.

The instant device (`--max-queue-delay-ms 0 --switch-ms 0`: a free device starts a batch at once) is the
model this bench used before, and is printed after the main table unless `--no-instant`. On it a device
busy all the time spends busy time = batches × overhead + item work, the same for every mode, so at equal
busy time every mode makes the same number of batches and mean fill can differ only where a mode leaves
devices idle.

Rows: mean batch fill (items per batch ÷ max batch), compute spread (max − min over mean of each device's
busy seconds), p50/p99 queueing delay, utilisation, model switches per batch, repacks. For lpt_packing
columns two planning rows, both from each model's measured device-seconds: `plan spread` is the spread
the final placement implies (replicas share a model evenly), `best plan spread` the lowest any placement
with the same replica counts and fitting weights could imply (exhaustive search). Where the best plan
cannot reach 10 %, no static placement meets the spread goal for that column: the demand shares are too
coarse for the replica counts.
`compute spread` is over the whole measured run, the goal's measure; `per 5 s window` is the mean spread of
windows about one repack interval long, which shows a run evened out only by models moving between repacks.
`--refine-steps 0` shows the packer without its refinement pass (the greedy LPT of seed 002 alone).

Columns: round_robin, least_outstanding (compute basis), then lpt_packing with one replica per model (`r=1`),
the hottest model on 2 replicas (`hot×2`; with fill_rr; with fill factor 0.25), and seed 002's replica lever
an operator pulls for hot models: the two hottest on 2 replicas each (`top2×2`), every model on 2 (`r=2`),
the hottest on 3 (`hot×3`). Every column runs the same trace with the same settings on every seed.

    .venv/bin/python scripts/bench/placement.py [--seed 1] [--requests 40000] [--load 0.2] [--scan 0.1,0.2,0.4]
        [--max-queue-delay-ms 5] [--switch-ms 0.5] [--no-instant] [--refine-steps N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import itertools
import math
import random
import shlex
import statistics
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from unittest import mock

import attrs

from sie.placement import packer
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
# Windows of the windowed spread: about one repack interval of the default trace.
WINDOW_S = 5.0


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


@attrs.frozen
class DeviceModel:
    """How a simulated device forms and runs batches (printed in the header of every table).

    `max_queue_delay_s`: a dynamic batcher's hold. A free device whose chosen model queue holds fewer than
    max batch items waits until that queue's oldest item has waited this long, and starts at once when
    the queue reaches max batch (Triton's `max_queue_delay_microseconds`; our sidecar's
    SIE_MAX_BATCH_WAIT_MS, 10 ms by default). 0 starts a batch the instant the device is free.
    `switch_s`: charged to a batch whose model differs from the device's previous batch (another graph's
    weights and kernels into caches). An assumption of this simulation, not a measurement.
    """

    max_queue_delay_s: float
    switch_s: float

    def describe(self) -> str:
        if self.max_queue_delay_s == 0 and self.switch_s == 0:
            return "instant device (the old model): a free device starts a batch at once, no switch cost"
        return (
            f"dynamic-batcher device: a partial batch waits up to {self.max_queue_delay_s * 1000:g} ms from its "
            f"oldest item's arrival (a full one starts at once); {self.switch_s * 1000:g} ms per model switch "
            "(assumed)"
        )


@attrs.define
class Device:
    """One simulated device: a queue per model, the batch running, its hold, and what it measured."""

    name: str
    queues: dict[str, deque[Request]] = attrs.Factory(dict)
    running: tuple[int, list[Request], float] | None = None  # the batch's sequence number, items, duration
    last_model: str | None = None
    hold: int | None = None  # the sequence number of the pending hold deadline, if holding
    compute_total: float = 0.0
    measured: dict[str, tuple[float, int]] = attrs.Factory(dict)  # model -> (seconds, items)

    def next_batch(self, now: float, max_queue_delay_s: float) -> tuple[list[Request] | None, float | None]:
        """The batch to start now, or None and until when to hold (None: nothing queued).

        A queue is ready when it holds max batch items or its oldest item has waited `max_queue_delay_s`;
        of the ready queues the one whose oldest item waited longest goes. With none ready the device holds
        for the queue with the oldest item (the one chosen when no hold is allowed), until its deadline.
        """
        waiting = sorted((queue[0].arrived, model_id) for model_id, queue in self.queues.items() if queue)
        if not waiting:
            return None, None
        for arrived, model_id in waiting:
            queue = self.queues[model_id]
            if len(queue) >= MAX_BATCH or now >= arrived + max_queue_delay_s:
                return [queue.popleft() for _ in range(min(MAX_BATCH, len(queue)))], None
        return None, waiting[0][0] + max_queue_delay_s


@attrs.define
class Stats:
    """What one run measured after the warm-up."""

    fills: list[float] = attrs.Factory(list)
    delays: list[float] = attrs.Factory(list)
    compute: dict[str, float] = attrs.Factory(dict)
    model_compute: dict[str, float] = attrs.Factory(dict)
    windows: dict[int, dict[str, float]] = attrs.Factory(dict)  # WINDOW_S window -> device -> seconds
    switches: int = 0
    moves: int = 0
    repacks: int = 0
    span: float = 0.0
    placement: dict[str, tuple[str, ...]] = attrs.Factory(dict)  # lpt_packing's final placement


class Simulation:
    """Runs one trace under one policy on devices of one DeviceModel."""

    def __init__(self, trace: Trace, policy: PlacementPolicy, device_model: DeviceModel, warmup_until: float) -> None:
        self.trace = trace
        self.device_model = device_model
        self.now = 0.0
        self.placement = Placement(policy, clock=lambda: self.now, wall_clock=lambda: self.now)
        self.devices = {name: Device(name) for name in DEVICES}
        self.events: list[tuple[float, int, str]] = []  # (time, sequence, device): a batch end or a hold deadline
        self.warmup_until = warmup_until
        self.stats = Stats(compute=dict.fromkeys(DEVICES, 0.0))
        self._sequence = 0

    def run(self) -> Stats:
        self.probe()
        next_probe = PROBE_INTERVAL_S
        for arrived, model_id in self.trace.arrivals:
            while self.events and self.events[0][0] <= arrived or next_probe <= arrived:
                if self.events and self.events[0][0] <= next_probe:
                    self.event(*heapq.heappop(self.events))
                else:
                    self.now, next_probe = next_probe, next_probe + PROBE_INTERVAL_S
                    self.probe()
            self.now = arrived
            self.arrive(model_id)
        while self.events:
            self.event(*heapq.heappop(self.events))
        self.stats.span = self.now - self.warmup_until
        snapshot = self.placement.snapshot()
        self.stats.repacks = sum(count for trigger, count in snapshot.repacks_total)
        if snapshot.policy.mode == "lpt_packing":
            self.stats.placement = {
                model.model_id: tuple(replica.child for replica in model.replicas) for model in snapshot.models
            }
        return self.stats

    def event(self, at: float, sequence: int, name: str) -> None:
        self.now = at
        device = self.devices[name]
        if device.running is not None and device.running[0] == sequence:
            self.complete(device)
        elif device.hold == sequence:
            device.hold = None
            self.start(device)
        # else: a hold deadline made stale by a batch that started before it (its queue filled)

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
        """Start a batch on the free device, or hold until its deadline (a new hold replaces the old)."""
        batch, hold_until = device.next_batch(self.now, self.device_model.max_queue_delay_s)
        self._sequence += 1
        if batch is None:
            if hold_until is not None and device.hold is None:
                device.hold = self._sequence
                heapq.heappush(self.events, (hold_until, self._sequence, device.name))
            return
        device.hold = None
        model_id = batch[0].model_id
        switched = device.last_model is not None and device.last_model != model_id
        duration = (
            OVERHEAD_S + len(batch) * self.trace.costs[model_id] + (self.device_model.switch_s if switched else 0.0)
        )
        device.running, device.last_model = (self._sequence, batch, duration), model_id
        if self.now >= self.warmup_until:
            self.stats.fills.append(len(batch) / MAX_BATCH)
            self.stats.delays.extend(self.now - request.arrived for request in batch)
            self.stats.compute[device.name] += duration
            self.stats.model_compute[model_id] = self.stats.model_compute.get(model_id, 0.0) + duration
            window = self.stats.windows.setdefault(int((self.now - self.warmup_until) // WINDOW_S), {})
            window[device.name] = window.get(device.name, 0.0) + duration
            self.stats.switches += switched
        heapq.heappush(self.events, (self.now + duration, self._sequence, device.name))

    def complete(self, device: Device) -> None:
        _, batch, duration = device.running or (0, [], 0.0)
        device.running = None
        model_id = batch[0].model_id
        device.compute_total += duration
        seconds, items = device.measured.get(model_id, (0.0, 0))
        device.measured[model_id] = (seconds + duration, items + len(batch))
        for request in batch:
            self.placement.finished(request.ticket, duration / len(batch))
        self.start(device)

    def probe(self) -> None:
        hosted = {model_id: set(self.placement.assigned(model_id)) for model_id in self.trace.costs}
        self.placement.update([self.report(device, hosted) for device in self.devices.values()])
        if self.now >= self.warmup_until:
            self.stats.moves += sum(
                set(self.placement.assigned(model_id)) != hosts for model_id, hosts in hosted.items()
            )

    def report(self, device: Device, hosted: dict[str, set[str]]) -> ChildReport:
        models = {}
        for model_id, hosts in hosted.items():
            seconds, items = device.measured.get(model_id, (0.0, 0))
            cost = seconds / items if items else None
            models[model_id] = ModelReport(model_id, device.name in hosts, self.trace.memory[model_id], cost, MAX_BATCH)
        return ChildReport(device.name, "sim", True, device.compute_total, MEMORY_BUDGET, models)


def spread(loads: Mapping[str, float] | list[float]) -> float:
    values = list(loads.values()) if isinstance(loads, Mapping) else loads
    return (max(values) - min(values)) / statistics.fmean(values)


def plan_spread(seconds: Mapping[str, float], placement: Mapping[str, tuple[str, ...]]) -> float:
    """The compute spread a placement implies for the models' measured seconds (replicas share evenly)."""
    loads = dict.fromkeys(DEVICES, 0.0)
    for model_id, children in placement.items():
        for child in children:
            loads[child] += seconds.get(model_id, 0.0) / len(children)
    return spread(loads)


def best_plan_spread(seconds: Mapping[str, float], replicas: Mapping[str, int], memory: Mapping[str, int]) -> float:
    """The lowest compute spread any placement with these replica counts and fitting weights implies
    (exhaustive; the devices are alike, so the heaviest model's children are fixed). inf: none fits."""
    models = sorted(seconds, key=lambda model_id: (-seconds[model_id], model_id))
    loads, used = [0.0] * len(DEVICES), [0] * len(DEVICES)
    best = math.inf

    def place(index: int) -> None:
        nonlocal best
        if index == len(models):
            best = min(best, spread(loads))
            return
        model_id = models[index]
        count, share = replicas[model_id], seconds[model_id] / replicas[model_id]
        choices = [tuple(range(count))] if index == 0 else itertools.combinations(range(len(DEVICES)), count)
        for children in choices:
            if any(used[child] + memory[model_id] > MEMORY_BUDGET for child in children):
                continue
            for child in children:
                loads[child] += share
                used[child] += memory[model_id]
            place(index + 1)
            for child in children:
                loads[child] -= share
                used[child] -= memory[model_id]

    place(0)
    return best


def summarise(stats: Stats, trace: Trace) -> dict[str, float]:
    delays = sorted(stats.delays)
    result = {
        "fill": statistics.fmean(stats.fills),
        "spread": spread(stats.compute),
        "p50": delays[len(delays) // 2] * 1000,
        "p99": delays[int(len(delays) * 0.99)] * 1000,
        "util": sum(stats.compute.values()) / (len(stats.compute) * stats.span),
        "windowed": statistics.fmean(
            spread([window.get(device, 0.0) for device in DEVICES])
            for index, window in stats.windows.items()
            if (index + 1) * WINDOW_S <= stats.span  # whole windows only
        ),
        "switches": stats.switches / len(stats.fills),
        "repacks": float(stats.repacks),
        "moves": float(stats.moves),
        "plan": math.nan,
        "best": math.nan,
    }
    if stats.placement:
        replicas = {model_id: len(children) for model_id, children in stats.placement.items()}
        result["plan"] = plan_spread(stats.model_compute, stats.placement)
        result["best"] = best_plan_spread(stats.model_compute, replicas, trace.memory)
    return result


def policies(trace: Trace, budget: float) -> dict[str, PlacementPolicy]:
    hot, second = sorted(trace.shares, key=lambda name: -trace.shares[name])[:2]
    lpt = PlacementPolicy(
        mode="lpt_packing", rebalance_compute_seconds=budget, first_rebalance_compute_seconds=budget / 5
    )
    return {
        "round_robin": PlacementPolicy(mode="round_robin"),
        "least_outst.": PlacementPolicy(mode="least_outstanding", work_basis="compute"),
        "lpt r=1": lpt,
        "lpt hot×2": lpt.with_model(hot, replicas=2),
        "lpt hot×2 rr": lpt.with_model(hot, replicas=2).with_knobs({"routing_policy": "fill_rr"}),
        # Seed 002's lever between the two goals: a smaller quantum balances more finely, batches less deeply.
        "lpt hot×2 f.25": lpt.with_model(hot, replicas=2, fill_factor=0.25),
        # The replica lever (seed 002: an operator promotes hot models): the two hottest on 2 GPUs each, every
        # model on 2, the hottest on 3.
        "lpt top2×2": lpt.with_model(hot, replicas=2).with_model(second, replicas=2),
        "lpt r=2": lpt.with_knobs({"default_replicas": 2}),
        "lpt hot×3": lpt.with_model(hot, replicas=3),
    }


def _cell(form: str, value: float) -> str:
    if math.isinf(value):
        return "none fits"  # best_plan_spread: no placement with these replicas fits the memory budgets
    return "-" if math.isnan(value) else form.format(value)


def print_table(results: dict[str, dict[str, float]]) -> None:
    rows = (
        ("mean batch fill", "fill", "{:.3f}"),
        ("compute spread", "spread", "{:.1%}"),
        (f"  per {WINDOW_S:g} s window", "windowed", "{:.1%}"),
        ("p50 queue ms", "p50", "{:.1f}"),
        ("p99 queue ms", "p99", "{:.1f}"),
        ("utilisation", "util", "{:.1%}"),
        ("switches/batch", "switches", "{:.2f}"),
        ("repacks", "repacks", "{:.0f}"),
        ("models moved", "moves", "{:.0f}"),
        ("plan spread", "plan", "{:.1%}"),
        ("best plan spread", "best", "{:.1%}"),
    )
    print(f"{'':18}" + "".join(f"{name:>16}" for name in results))
    for label, key, form in rows:
        print(f"{label:18}" + "".join(f"{_cell(form, result[key]):>16}" for result in results.values()))
    base = results["round_robin"]["fill"]
    print(f"{'fill ÷ rr':18}" + "".join(f"{result['fill'] / base:>15.2f}×" for result in results.values()))


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


@contextlib.contextmanager
def refine_steps(steps: int | None) -> Iterator[None]:
    """The router's repacks with `steps` refinement steps (None: the packer's default)."""
    if steps is None:
        yield
        return
    with mock.patch("sie.placement.router.pack", functools.partial(packer.pack, refine_steps=steps)):
        yield


def run_modes(
    args: argparse.Namespace,
    load: float,
    device_model: DeviceModel,
    names: tuple[str, ...] | None = None,
    verbose: bool = False,
) -> dict[str, dict[str, float]]:
    """Every mode (or those named) on the same trace, measured after the warm-up."""
    trace = make_trace(args.seed, args.requests, load, args.skew)
    # Half the trace's item work: with the batch overhead that is about 8 repacks over the trace.
    budget = sum(trace.costs[model_id] for _, model_id in trace.arrivals) / 2
    if verbose:
        describe(trace, budget)
    warmup_until = trace.arrivals[int(len(trace.arrivals) * args.warmup)][0]
    chosen = {name: policy for name, policy in policies(trace, budget).items() if names is None or name in names}
    with refine_steps(args.refine_steps):
        return {
            name: summarise(Simulation(trace, policy, device_model, warmup_until).run(), trace)
            for name, policy in chosen.items()
        }


def print_verdicts(results: dict[str, dict[str, float]]) -> None:
    """Issue 12's goal per lpt_packing column, on the whole measured run's spread (the windowed spread and the
    best static plan beside it, so a spread evened out only by models moving between repacks shows)."""
    base = results["round_robin"]["fill"]
    for name, result in results.items():
        if name.startswith("lpt"):
            met = result["fill"] >= 1.5 * base and result["spread"] <= 0.10
            print(
                f"goal (fill >= 1.5× round_robin's, compute spread <= 10%) for {name}: {'met' if met else 'NOT met'} "
                f"(fill {result['fill'] / base:.2f}×, spread {result['spread']:.1%}; per {WINDOW_S:g} s window "
                f"{result['windowed']:.1%}, best static plan {_cell('{:.1%}', result['best'])})"
            )


def print_scan(args: argparse.Namespace, device_model: DeviceModel) -> None:
    """One line per load: round_robin against lpt_packing with the hot model on 2 replicas."""
    print(f"{'load':>6}{'rr util':>9}{'lpt util':>9}{'rr fill':>9}{'lpt fill':>9}{'ratio':>7}{'spread':>8}"
          f"{'rr p50':>8}{'lpt p50':>8}")  # fmt: skip
    for load in args.scan:
        results = run_modes(args, load, device_model, ("round_robin", "lpt hot×2"))
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
    parser.add_argument(
        "--max-queue-delay-ms", type=float, default=5.0, help="a partial batch's longest hold (0: start at once)"
    )
    parser.add_argument("--switch-ms", type=float, default=0.5, help="charged when a device changes model")
    parser.add_argument("--no-instant", action="store_true", help="skip the instant device's table")
    parser.add_argument("--refine-steps", type=int, help="packer refinement steps (default: the packer's)")
    args = parser.parse_args(argv)
    print("command:", shlex.join(["python", "scripts/bench/placement.py", *(sys.argv[1:] if argv is None else argv)]))
    device_model = DeviceModel(args.max_queue_delay_ms / 1000, args.switch_ms / 1000)
    steps = packer.DEFAULT_REFINE_STEPS if args.refine_steps is None else args.refine_steps
    print(f"packer: greedy LPT + up to {steps} refinement steps per repack")
    if args.scan:
        print(device_model.describe())
        print_scan(args, device_model)
        return 0
    models = [device_model]
    instant = DeviceModel(0.0, 0.0)
    if not args.no_instant and device_model != instant:
        models.append(instant)
    for index, model in enumerate(models):
        results = run_modes(args, args.load, model, verbose=index == 0)
        print()
        print(f"{model.describe()}; measured after the first {args.warmup:.0%} of the trace")
        print_table(results)
        print_verdicts(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
