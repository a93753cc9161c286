"""Faults survived, measured (issue 13 §4): each scenario on a fresh distributed cluster (nats-server with file
storage, gateway, sidecar, worker as real processes), N clients sending their own texts through the public SDK and
checking every answer against its own text's reference; one row per scenario: calls sent, verified, failed (an
error answer after the SDK's retries), lost (no answer by the call's deadline, or another text's answer),
recovery seconds and the slowest call.

    .venv/bin/python scripts/reliability/report.py                      # 300 clients, every scenario
    .venv/bin/python scripts/reliability/report.py --clients 60 --duration 30 --scenario sidecar nats

Recovery: from the fault (kill, broker stop, or the broker's start in `nats_down`) to the first 200 of an attempt
sent after it. `none` is the same load with no fault, to tell overload from the fault's harm. Below each row, the
reasons of failed and lost calls and the attempts the SDK saw refused (it retried most). Logs stay in the printed
directory.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import SCENARIOS, reference_cluster, run_scenario, scenario_cluster  # noqa: E402
from load import LoadOptions, References, Tally, make_texts  # noqa: E402

HEADER = f"{'scenario':<10} {'sent':>7} {'verified':>9} {'failed':>7} {'lost':>6} {'recovery s':>11} {'slowest s':>10}"


def row(tally: Tally) -> str:
    recovery = "-" if tally.recovery_s is None or tally.scenario == "none" else f"{tally.recovery_s:.1f}"
    counts = f"{tally.sent:>7} {tally.verified:>9} {tally.failed:>7} {tally.lost:>6}"
    return f"{tally.scenario:<10} {counts} {recovery:>11} {tally.slowest_s:>10.1f}"


async def measure(scenarios: list[str], options: LoadOptions, root: Path) -> list[Tally]:
    """Run each scenario on its own cluster; references come from the first cluster that starts with a broker
    (or one started for them when only `nats_down` runs)."""
    references: References | None = None
    tallies = []
    for index, scenario in enumerate(scenarios, 1):
        directory = root / f"{index}-{scenario}"
        directory.mkdir()
        if scenario == "nats_down" and references is None:
            references = await reference_cluster(root / "references", options)
        cluster = scenario_cluster(directory, scenario)
        try:
            if scenario != "nats_down":
                await asyncio.to_thread(cluster.wait_serving)
            if references is None:
                references = await References.compute(cluster.url, make_texts(options.text_count))
            tally = await run_scenario(cluster, scenario, references, options)
        finally:
            await asyncio.to_thread(cluster.close)
        print(row(tally), flush=True)
        for reason, count in tally.reasons:
            print(f"{'':<10} {count:>7} × {reason}", flush=True)
        for refusal, count in tally.refusals:
            print(f"{'':<10} {count:>7} × attempt answered {refusal}", flush=True)
        tallies.append(tally)
    return tallies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=300, help="concurrent clients (default 300)")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of load per scenario (default 40)")
    parser.add_argument("--fault-at", type=float, default=5.0, help="seconds into the load of the fault (default 5)")
    parser.add_argument(
        "--deadline", type=float, default=30.0,
        help="each call's budget in seconds, the SDK's provision_timeout_s (default 30: the gateway's request timeout)",
    )  # fmt: skip
    parser.add_argument("--items", type=int, default=1, help="texts per call (default 1)")
    parser.add_argument(
        "--settle", type=float, default=None,
        help="end the load this many seconds after the recovery (at most --duration); default: the whole --duration",
    )  # fmt: skip
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = parser.parse_args()
    options = LoadOptions(args.clients, args.duration, args.fault_at, args.deadline, args.items, settle_s=args.settle)
    # The NATS-down start needs references from a cluster that had a broker: it runs last.
    scenarios = sorted(args.scenario, key=lambda name: name == "nats_down")
    root = Path(tempfile.mkdtemp(prefix="sie-faults-"))
    print(f"{options.clients} clients, {options.duration_s:g} s per scenario, fault at {options.fault_at_s:g} s, "
          f"deadline {options.deadline_s:g} s per call; logs in {root}")  # fmt: skip
    print(HEADER)
    asyncio.run(measure(scenarios, options, root))


if __name__ == "__main__":
    main()
