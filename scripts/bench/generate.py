"""Generation: tokens/s and time to first token of the raw onnxruntime decode loop on the converted decoder graph.

    .venv/bin/python scripts/bench/generate.py [--rounds 3] [--max-tokens 64] [--streams 1 8] [--threads 2]
                                               [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--conversion]

The raw side of issue 17's comparison: N streams are N ChatML prompts decoded together as one left-padded batch
in one session (prefill once, then one run per token for the whole batch, the cache carried between runs), greedy,
for exactly `--max-tokens` tokens each, so every round does the same work. Time to first token is the prefill run;
tokens/s counts every stream's tokens after the first over the decode runs. Each (streams) cell is measured once
per round, rounds interleaved, medians printed. `--conversion` also times a GGUF→ONNX conversion into a scratch
directory. The served side (the gateway's /v1/generate and chat completions) joins this table with the adapter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from sie.catalog import load_catalog
from sie.settings import load_settings
from sie.worker.artifacts import profile_artifacts
from sie.worker.convert import CONFIG_FILE, TOKENIZER_FILE, convert_gguf
from sie.worker.decoding import CacheShape, empty_cache, next_cache
from sie.worker.loading import ModelLoader, PreparedFiles

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three uses of a paperclip.",
    "What is 17 times 23?",
    "Give me a tip for learning a new language.",
    "Why is the sky blue?",
    "Name a famous painting and its painter.",
]


def chatml(question: str) -> str:
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@attrs.frozen
class Measurement:
    first_token_s: float
    tokens_per_s: float


def make_session(graph: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False  # as the worker's sessions (sie.worker.session)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(graph), sess_options=options, providers=["CPUExecutionProvider"])


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(ids) for ids in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def decode_batch(
    session: ort.InferenceSession, prompts: list[list[int]], shape: CacheShape, max_tokens: int, pad_id: int
) -> Measurement:
    """Greedy-decode every prompt together for `max_tokens` tokens; the raw loop a served engine is compared to."""
    names = [output.name for output in session.get_outputs()]
    ids, mask = left_padded(prompts, pad_id)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    cache = empty_cache(shape, batch=len(prompts))
    started = time.perf_counter()
    first_token_s = 0.0
    for step in range(max_tokens):
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **cache}
        outputs = session.run(None, feeds)
        ids = np.argmax(outputs[names.index("logits")][:, -1], axis=-1).astype(np.int64)[:, None]
        if step == 0:
            first_token_s = time.perf_counter() - started
        cache = next_cache(names, outputs)
        positions = positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
    decode_s = time.perf_counter() - started - first_token_s
    return Measurement(first_token_s, len(prompts) * (max_tokens - 1) / decode_s if decode_s > 0 else 0.0)


def prepare(model_id: str) -> tuple[PreparedFiles, Path]:
    """The converted decoder's files (fetched and converted when missing) and the GGUF they came from."""
    settings = load_settings()
    entry = load_catalog(settings.catalog.bundles_dir, settings.catalog.models_dir).get(model_id)
    loader = ModelLoader.from_settings(settings.worker)
    files = loader.prepare(entry.model, entry.profile, entry.model_id)
    model_dir = loader.resolver.resolve(profile_artifacts(entry.model, entry.profile).model)
    return files, model_dir / entry.model.resolve_profile(entry.profile).loadtime_options["gguf_file"]


def conversion_seconds(gguf: Path) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        convert_gguf(gguf, Path(scratch) / "decoder")
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--conversion", action="store_true", help="also time one GGUF→ONNX conversion")
    args = parser.parse_args(argv)
    files, gguf = prepare(args.model)
    config = json.loads((files.model_dir / CONFIG_FILE).read_text())
    tokenizer = Tokenizer.from_file(str(files.tokenizer_dir / TOKENIZER_FILE))
    session = make_session(files.graph, args.threads)
    shape = CacheShape.from_config(config)
    pad_id = int(config.get("pad_token_id", 0))
    prompts = [tokenizer.encode(chatml(QUESTIONS[i % len(QUESTIONS)])).ids for i in range(max(args.streams))]
    decode_batch(session, prompts[:1], shape, 4, pad_id)  # warm-up
    results: dict[int, list[Measurement]] = {streams: [] for streams in args.streams}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}", file=sys.stderr)
        for streams in args.streams:
            results[streams].append(decode_batch(session, prompts[:streams], shape, args.max_tokens, pad_id))
    print(f"raw onnxruntime decode loop, {args.model}, {args.threads} intra-op threads, {args.max_tokens} tokens per")
    print(f"stream, greedy; graph {files.graph.stat().st_size / 1e6:.0f} MB ({config.get('torch_dtype')}); median of")
    print(f"{args.rounds} rounds")
    print("| streams | time to first token | tokens/s (all streams) | tokens/s per stream |")
    print("|---|---|---|---|")
    for streams, measured in results.items():
        ttft = statistics.median(m.first_token_s for m in measured)
        rate = statistics.median(m.tokens_per_s for m in measured)
        print(f"| {streams} | {ttft * 1000:.0f} ms | {rate:.1f} | {rate / streams:.1f} |")
    if args.conversion:
        print(f"GGUF→ONNX conversion (float32): {conversion_seconds(gguf):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
