"""The dialect routes against the native ones on one `all` server, side by side: TEI's `/{model}/embed` against
`/v1/encode/{model}` (32 keep-alive clients × 1 sentence, 1 client × batches of 32) and Cohere's `/v2/rerank`
against `/v1/score/{model}` (a query and 16 documents, 8 clients), the same texts, `wrk` as the load generator,
medians of `--rounds` interleaved rounds. Prints items per second and the ratio dialect / native (the goal: ≥ 0.95).

    .venv/bin/python scripts/bench/dialects.py [--rounds 3] [--load-seconds 3] [--http-server uvicorn]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_ort import SENTENCES  # noqa: E402
from topology import Topology  # noqa: E402
from wrk import run_wrk, wrk_binary  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DOCUMENTS = 16
WARM_UP_S = 1


def rotated(count: int, offset: int) -> list[str]:
    return [SENTENCES[(offset + index) % len(SENTENCES)] for index in range(count)]


def bodies(route: str, per_request: int) -> list[bytes]:
    """One body per rotation of the benchmark sentences, in `route`'s shape."""
    shapes = {
        "native-encode": lambda texts: {"items": [{"text": text} for text in texts]},
        "tei-embed": lambda texts: {"inputs": texts},
        "native-score": lambda texts: {"query": {"text": texts[0]}, "items": [{"text": text} for text in texts[1:]]},
        "cohere-rerank": lambda texts: {"model": MODEL, "query": texts[0], "documents": texts[1:]},
    }
    return [orjson.dumps(shapes[route](rotated(per_request, offset))) for offset in range(len(SENTENCES))]


PATHS = {
    "native-encode": f"/v1/encode/{MODEL}",
    "tei-embed": f"/{MODEL}/embed",
    "native-score": f"/v1/score/{MODEL}",
    "cohere-rerank": "/v2/rerank",
}
# (scenario, route, texts per request, items counted per request, connections)
SCENARIOS = [
    ("32 clients x 1 sentence", "native-encode", 1, 1, 32),
    ("32 clients x 1 sentence", "tei-embed", 1, 1, 32),
    ("1 client x batch of 32", "native-encode", 32, 32, 1),
    ("1 client x batch of 32", "tei-embed", 32, 32, 1),
    (f"8 clients x query + {DOCUMENTS} documents", "native-score", DOCUMENTS + 1, DOCUMENTS, 8),
    (f"8 clients x query + {DOCUMENTS} documents", "cohere-rerank", DOCUMENTS + 1, DOCUMENTS, 8),
]
PAIRS = {"tei-embed": "native-encode", "cohere-rerank": "native-score"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load-seconds", type=int, default=3)
    parser.add_argument("--http-server", default="uvicorn", choices=("uvicorn", "hypercorn"))
    args = parser.parse_args(argv)
    wrk_binary()
    topology = Topology("all", MODEL, "onnx", [], args.http_server)
    measured: dict[tuple[str, str], list[float]] = {}
    try:
        topology.wait_serving(MODEL)
        for index in range(args.rounds):
            print(f"round {index + 1}/{args.rounds}", file=sys.stderr)
            order = SCENARIOS if index % 2 == 0 else SCENARIOS[::-1]  # neither route always goes first
            for scenario, route, texts, items, connections in order:
                shaped = bodies(route, texts)
                run_wrk(topology.url, PATHS[route], shaped, connections, WARM_UP_S, items)
                stats = run_wrk(topology.url, PATHS[route], shaped, connections, args.load_seconds, items)
                if stats.failures:
                    raise SystemExit(f"{route}: {stats.failures} failed requests")
                measured.setdefault((scenario, route), []).append(stats.requests * items / stats.duration_s)
    finally:
        topology.stop()
    print(f"all-in-one, {args.http_server}, wrk, medians of {args.rounds} interleaved rounds (items/s)")
    print("| scenario | native | dialect | dialect / native |")
    print("|---|---|---|---|")
    for (scenario, route), values in measured.items():
        if route not in PAIRS:
            continue
        native = statistics.median(measured[(scenario, PAIRS[route])])
        dialect = statistics.median(values)
        print(f"| {scenario} ({route}) | {native:.0f} | {dialect:.0f} | {dialect / native:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
