"""Served throughput against the raw graph, side by side: one `sie run --role all` over a scratch catalogue, 32 wrk
connections × one text per request to each model's `/v1/encode` route, interleaved per round with the same graph run
in-process at batch 32 on token ids already made. Shared by `families.py --served` and `decoders.py --served`, as
are `timed`, the median of a few timed calls, and `measured_window`, one served measurement of a model whose batches
take a while.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
import numpy as np
import orjson
from wrk import WrkStats, run_wrk, wrk_binary

from launcher import serving_all

CONNECTIONS = 32
WARM_UP_S = 2
# Batches one measured window holds at least: the one still running when wrk stops goes uncounted (1/30 low at most).
WINDOW_BATCHES = 30
REPO = Path(__file__).resolve().parents[2]


def timed(run: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `repeats` calls."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(samples)


def measured_window(url: str, path: str, bodies: list[bytes], batch_seconds: float, seconds: int) -> WrkStats:
    """One served measurement of `CONNECTIONS` wrk connections after a warm-up, in a window of at least `seconds` and
    WINDOW_BATCHES batches (a batch taking `batch_seconds` at the raw rate): wrk counts the requests answered within
    its window, and every connection's last request, still running when it ends, goes uncounted — about one batch,
    so a window of n batches reads up to 1/n low (GLiNER's 2.7-second batches: served / raw 0.79 in windows of ten
    batches, 1.02 in windows of thirty, `families.py --only-gliner --served`). The server is let go idle after the
    warm-up and after the window: wrk drops its connections at the end of a run, but the batches their requests
    started still run (up to two in flight per model), and would otherwise take the first seconds of the window or of
    the next raw timing."""
    run_wrk(url, path, bodies, CONNECTIONS, WARM_UP_S, 1)
    time.sleep(2 * batch_seconds)
    stats = run_wrk(url, path, bodies, CONNECTIONS, max(seconds, math.ceil(WINDOW_BATCHES * batch_seconds)), 1)
    time.sleep(2 * batch_seconds)
    return stats


def served_vs_raw(  # noqa: PLR0913 - one run's parts
    scratch: Path,
    raw_runs: Mapping[str, Callable[[np.ndarray], object]],
    text: str,
    vocabulary: int,
    tokens: int,
    rounds: int,
    seconds: int,
    env: Mapping[str, str] | None = None,
) -> None:
    """Serve `scratch/models` (its models `bench/{name}` for each name of `raw_runs`), and print per model the raw
    rate (`raw_runs[name](ids)` on a [32, tokens] batch of ids below `vocabulary`), the served rate (`text` per
    request) and their ratio, medians of `rounds` interleaved rounds of `seconds` measured wrk seconds."""
    wrk_binary()
    bodies = [orjson.dumps({"items": [{"text": text}]})]
    environment = {"SIE_MODELS_DIR": str(scratch / "models"), "SIE_MODEL_CACHE": str(scratch / "cache"),
                   "SIE_HTTP_SERVER": "uvicorn", **(env or {})}  # fmt: skip
    rng = np.random.default_rng(1)
    served: dict[str, list[float]] = {name: [] for name in raw_runs}
    raw: dict[str, list[float]] = {name: [] for name in raw_runs}
    preload = ",".join(f"bench/{name}" for name in raw_runs)
    arguments = ["--bundles-dir", str(REPO / "config" / "bundles"), "--preload", preload]
    with serving_all(scratch / "server.log", arguments, environment) as url:
        for name in raw_runs:  # loaded (converted on first use) before anything is timed
            answer = httpx.post(f"{url}/v1/encode/bench/{name}", content=bodies[0], timeout=600,
                                headers={"content-type": "application/json"})  # fmt: skip
            answer.raise_for_status()
        for round_index in range(rounds):
            print(f"served round {round_index + 1}/{rounds}", file=sys.stderr)
            for name, run in raw_runs.items():
                ids = rng.integers(5, vocabulary, size=(CONNECTIONS, tokens)).astype(np.int64)
                run(ids)  # warm up
                raw[name].append(CONNECTIONS * 1000.0 / timed(lambda run=run, ids=ids: run(ids), 2))
                stats = measured_window(url, f"/v1/encode/bench/{name}", bodies, CONNECTIONS / raw[name][-1], seconds)
                if stats.failures:
                    raise SystemExit(f"{name}: {stats.failures} failed requests; see {scratch / 'server.log'}")
                served[name].append(stats.items_per_second)
    print(f"\nserved: `sie run --role all` (uvicorn), {CONNECTIONS} connections x 1 text of {tokens} tokens, against "
          f"the same graph in-process at batch {CONNECTIONS}; medians of {rounds} interleaved rounds")  # fmt: skip
    print("| family | raw graph texts/s | served texts/s | served / raw |")
    print("|---|---|---|---|")
    for name in raw_runs:
        raw_rate, served_rate = statistics.median(raw[name]), statistics.median(served[name])
        print(f"| {name} | {raw_rate:.1f} | {served_rate:.1f} | {served_rate / raw_rate:.2f} |")
