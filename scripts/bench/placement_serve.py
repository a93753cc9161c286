"""Placement on real worker children, side by side: `sie run --role all --devices cpu:2` serving two models
under concurrent load, once per placement mode, interleaved for `--rounds` rounds (the mode order rotates
each round); medians per mode.

    .venv/bin/python scripts/bench/placement_serve.py [--rounds 3] [--load-seconds 8] [--clients 16]
        [--modes round_robin,least_outstanding,lpt_packing]

Per mode and round: a fresh server with both models preloaded (on every child for round_robin and
least_outstanding; lpt_packing places each on one child), `--clients` keep-alive connections per model each
sending single-sentence requests for `--load-seconds` (`sie bench`'s load, `sie.cli.bench.measure`); then
`GET /v1/placement` says where each model's batches ran. Printed: items/s, mean batch size (items per RunBatch) per
model, and per model the share of its batches each child ran.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_ort import SENTENCES  # noqa: E402
from topology import start_all  # noqa: E402

from launcher import RoleProcess  # noqa: E402
from sie.cli.bench import Cell, measure  # noqa: E402 - the load `sie bench` sends

MODELS = ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/paraphrase-MiniLM-L3-v2")
MODES = ("round_robin", "least_outstanding", "lpt_packing")
WARM_UP_S = 1.0


def start_server(mode: str, directory: Path) -> tuple[RoleProcess, str]:
    """The server for one mode, with both models answering."""
    args = ["--devices", "cpu:2", "--preload", ",".join(MODELS)]
    process, url = start_all(args, {"SIE_PLACEMENT_MODE": mode}, directory / f"all-{mode}.log")
    for model in MODELS:
        response = httpx.post(f"{url}/v1/encode/{model}", json={"items": [{"text": "warm"}]}, timeout=60)
        if response.status_code != 200:
            process.kill()
            raise SystemExit(f"the {mode} server answers {response.status_code} for {model}; log in {directory}")
    return process, url


def load(url: str, clients: int, seconds: float) -> list[Cell]:
    """`clients` clients per model, each sending single distinct sentences (`sie bench`'s load), all at once."""
    bodies = [{"items": [{"text": sentence}]} for sentence in SENTENCES]

    async def both() -> list[Cell]:
        return list(await asyncio.gather(*(measure(url, f"/v1/encode/{model}", bodies, clients, seconds)
                                           for model in MODELS)))  # fmt: skip

    return asyncio.run(both())


def placement_counts(url: str) -> dict[str, dict[str, tuple[int, int]]]:
    """model → child → (routed batches, routed items) since the server started."""
    state = httpx.get(f"{url}/v1/placement", timeout=10).json()
    counts: dict[str, dict[str, tuple[int, int]]] = {}
    for model in state["models"]:
        counts[model["model"]] = {
            replica["worker"]: (replica["routed_batches"], replica["routed_items"]) for replica in model["replicas"]
        }
    return counts


def delta(after: dict, before: dict) -> dict[str, dict[str, tuple[int, int]]]:
    result: dict[str, dict[str, tuple[int, int]]] = {}
    for model, children in after.items():
        for child, (batches, items) in children.items():
            old_batches, old_items = before.get(model, {}).get(child, (0, 0))
            result.setdefault(model, {})[child] = (batches - old_batches, items - old_items)
    return result


def run_mode(mode: str, clients: int, seconds: float, directory: Path) -> dict:
    process, url = start_server(mode, directory)
    try:
        load(url, clients, WARM_UP_S)  # warm both models on every replica they have
        before = placement_counts(url)
        cells = load(url, clients, seconds)
        routed = delta(placement_counts(url), before)
    finally:
        process.stop()
    return {"items_per_s": sum(cell.items_per_s for cell in cells), "failures": sum(cell.errors for cell in cells),
            "routed": routed}  # fmt: skip


def mean_batch(routed: dict[str, tuple[int, int]]) -> float:
    batches = sum(batches for batches, _ in routed.values())
    items = sum(items for _, items in routed.values())
    return items / batches if batches else 0.0


def shares(routed: dict[str, tuple[int, int]]) -> str:
    total = sum(batches for batches, _ in routed.values()) or 1
    return " ".join(f"{child}:{100 * batches / total:.0f}%" for child, (batches, _) in sorted(routed.items()))


def report(results: dict[str, list[dict]], clients: int, seconds: float) -> None:
    print(f"\n{len(MODELS)} models x {clients} clients x 1 sentence, {seconds:g} s per run, --devices cpu:2; "
          f"medians of {len(next(iter(results.values())))} interleaved rounds\n")  # fmt: skip
    header = f"{'mode':<20}{'items/s':>10}{'fails':>7}"
    for model in MODELS:
        short = model.rsplit("/", 1)[1][:22]
        header += f"  {short + ' batch':>28}  {'where it ran':<26}"
    print(header)
    for mode, runs in results.items():
        line = f"{mode:<20}{statistics.median(run['items_per_s'] for run in runs):>10.1f}"
        line += f"{sum(run['failures'] for run in runs):>7}"
        for model in MODELS:
            batch = statistics.median(mean_batch(run["routed"].get(model, {})) for run in runs)
            line += f"  {batch:>28.2f}  {shares(runs[-1]['routed'].get(model, {})):<26}"
        print(line)
    base = statistics.median(run["items_per_s"] for run in results[next(iter(results))])
    print()
    for mode, runs in results.items():
        ratio = statistics.median(run["items_per_s"] for run in runs) / base if base else 0.0
        print(f"{mode}: throughput {ratio:.2f}x {next(iter(results))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load-seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    directory = Path(f"/tmp/sie-bench-placement-{int(time.time())}")
    directory.mkdir(parents=True, exist_ok=True)
    print("command: " + " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]))
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    for round_index in range(args.rounds):
        order = modes[round_index % len(modes) :] + modes[: round_index % len(modes)]
        for mode in order:
            results[mode].append(run_mode(mode, args.clients, args.load_seconds, directory))
            print(f"round {round_index + 1} {mode}: {results[mode][-1]['items_per_s']:.1f} items/s", flush=True)
    report(results, args.clients, args.load_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
