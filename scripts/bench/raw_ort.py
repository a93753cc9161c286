"""The ceiling: sentences/s of each baseline model run by onnxruntime in-process, nothing else.

Inputs are tokenized and padded once up front, so only `session.run` is timed. Every (model,
threads, batch) cell is measured in each of `--rounds` interleaved rounds and the median printed.
Later benchmarks divide their throughput by these numbers.

    .venv/bin/python scripts/bench/raw_ort.py [--rounds 3] [--seconds 1.0] [--models ID ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from sie.catalog import load_catalog
from sie.settings import load_settings
from sie.tokenization import TextTokenizer, pad_batch
from sie.worker.loading import DEFAULT_MAX_SEQUENCE_LENGTH, ModelLoader

BATCH_SIZES = (1, 8, 32)
THREADS = (1, 2)
SENTENCES = [
    "A man is playing a guitar on the street corner.",
    "The quarterly report shows revenue growth in every region.",
    "How do I reset the password for my online banking account?",
    "Paris is the capital and most populous city of France.",
    "The kitten slept peacefully on the warm windowsill all afternoon.",
    "Scientists discovered a new species of frog in the rainforest.",
    "Please send the signed contract back by Friday morning.",
    "The recipe calls for two eggs, flour, sugar and a pinch of salt.",
]


def make_session(graph: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(graph), sess_options=options, providers=["CPUExecutionProvider"])


def feeds_for(
    session: ort.InferenceSession,
    tokenizer: TextTokenizer,
    batch: int,
    offset: int = 0,
    texts: Sequence[str] = SENTENCES,
) -> dict[str, np.ndarray]:
    """The session's inputs for `batch` of `texts` (the benchmark sentences) from `offset` on (rotating), tokenized
    and padded."""
    tokens = tokenizer.encode_batch([texts[(offset + i) % len(texts)] for i in range(batch)])
    padded = pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], tokenizer.pad_id)
    available = {
        "input_ids": padded.input_ids,
        "attention_mask": padded.attention_mask,
        "token_type_ids": padded.token_type_ids,
    }
    return {node.name: available[node.name] for node in session.get_inputs()}


def sentences_per_second(session: ort.InferenceSession, feeds: dict[str, np.ndarray], seconds: float) -> float:
    """Run until `seconds` have passed (at least 3 runs) after one warm-up; bounded by time, not count."""
    batch = next(iter(feeds.values())).shape[0]
    session.run(None, feeds)
    runs, start = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - start < seconds:
        session.run(None, feeds)
        runs += 1
    return runs * batch / (time.perf_counter() - start)


def tokenized_runs(
    session: ort.InferenceSession,
    tokenizer: TextTokenizer,
    batch: int,
    seconds: float,
    texts: Sequence[str] = SENTENCES,
) -> tuple[float, list[float]]:
    """What a server does at the least per request, timed: tokenize `batch` of `texts` (rotating; the benchmark
    sentences), pad, run. Until `seconds` have passed (at least 3 runs) after one warm-up; returns (texts/s, the
    seconds of each run)."""

    def run(offset: int) -> None:
        session.run(None, feeds_for(session, tokenizer, batch, offset, texts))

    run(0)
    durations: list[float] = []
    start = time.perf_counter()
    while len(durations) < 3 or time.perf_counter() - start < seconds:
        began = time.perf_counter()
        run(len(durations))
        durations.append(time.perf_counter() - began)
    return len(durations) * batch / (time.perf_counter() - start), durations


def load_graphs(model_ids: list[str] | None) -> dict[str, tuple[Path, TextTokenizer]]:
    settings = load_settings()
    catalog = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir)
    loader = ModelLoader.from_settings(settings.worker)
    graphs = {}
    encoders = sorted(model_id for model_id, entry in catalog.entries.items() if not entry.model.tasks.generate)
    for model_id in model_ids or encoders:
        entry = catalog.get(model_id)
        files = loader.prepare(entry.model, entry.profile, entry.model_id)
        max_length = entry.model.max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH
        graphs[entry.model_id] = (
            files.graph,
            TextTokenizer.from_file(files.tokenizer_dir / "tokenizer.json", max_length),
        )
    return graphs


def measure(graphs: dict, rounds: int, seconds: float) -> dict[tuple[str, int, int], list[float]]:
    """`{(model, threads, batch): [sent/s per round]}`; each round visits every cell once (interleaved)."""
    sessions = {(m, t): make_session(g, t) for m, (g, _) in graphs.items() for t in THREADS}
    results: dict[tuple[str, int, int], list[float]] = {}
    for round_index in range(rounds):
        print(f"round {round_index + 1}/{rounds}", file=sys.stderr)
        for (model_id, threads), session in sessions.items():
            for batch in BATCH_SIZES:
                feeds = feeds_for(session, graphs[model_id][1], batch)
                rate = sentences_per_second(session, feeds, seconds)
                results.setdefault((model_id, threads, batch), []).append(rate)
    return results


def print_table(results: dict[tuple[str, int, int], list[float]], rounds: int) -> None:
    print(f"raw onnxruntime, sentences/s (median of {rounds} interleaved rounds; model time only)")
    header = "| model | intra-op threads | " + " | ".join(f"batch {b}" for b in BATCH_SIZES) + " |"
    print(header)
    print("|" + "---|" * (2 + len(BATCH_SIZES)))
    for model_id in sorted({key[0] for key in results}):
        for threads in THREADS:
            cells = [statistics.median(results[(model_id, threads, batch)]) for batch in BATCH_SIZES]
            print(f"| {model_id} | {threads} | " + " | ".join(f"{cell:,.0f}" for cell in cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="measuring time per cell per round")
    parser.add_argument("--models", nargs="*", help="model ids (default: every baseline encoder and profile)")
    args = parser.parse_args(argv)
    graphs = load_graphs(args.models)
    print_table(measure(graphs, args.rounds, args.seconds), args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
