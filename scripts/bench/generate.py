"""Generation: tokens/s and time to first token, served (`sie run --role all`, streamed `/v1/generate`) beside the
raw onnxruntime decode loop on the same converted decoder graph.

    .venv/bin/python scripts/bench/generate.py [--rounds 3] [--max-tokens 64] [--streams 1 8] [--threads 2]
                                               [--model HuggingFaceTB/SmolLM2-135M-Instruct] [--conversion] [--raw-only]

Raw: N streams are N ChatML prompts decoded together as one left-padded batch in one session (prefill once, then
one run per token for the whole batch, the cache carried between runs), greedy, for exactly `--max-tokens` tokens
each. Time to first token is the prefill run; tokens/s counts every stream's tokens after the first over the decode
runs. Served: the same N prompts sent at once as N streamed `/v1/generate` requests (greedy, `max_new_tokens` the
same) to one server with the same intra-op threads; time to first token is each request's wait for its first text
(median over streams), tokens/s counts every stream's tokens after its first over the window from the earliest first
token to the last stream's end (the server prefills arrivals between decode steps, so later streams start inside the
window: the figure is conservative). The prompts ask for long answers so that streams rarely stop before
`--max-tokens`; tokens are counted from each answer's usage. Cells are measured once per round, raw and served
interleaved, medians printed with the served/raw ratios. `--conversion` also times a GGUF→ONNX conversion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import httpx
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from sie.catalog import load_catalog
from sie.settings import load_settings
from sie.worker.artifacts import profile_artifacts
from sie.worker.convert import CONFIG_FILE, TOKENIZER_FILE, convert_gguf
from sie.worker.generation.kv_cache import CacheShape, empty_cache, next_cache
from sie.worker.loading import ModelLoader, PreparedFiles

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "Write a long story about a lighthouse keeper.",
    "Explain in detail how photosynthesis works.",
    "Describe the history of the Roman Empire at length.",
    "Write a detailed guide to learning a new language.",
    "Explain at length why the sky is blue.",
    "Write a long essay about the ocean.",
    "Describe in detail how a computer works.",
    "Write a long letter to a friend about your travels.",
]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from topology import start_all  # noqa: E402


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


@attrs.frozen
class StreamTimes:
    first_token_s: float  # since the request was sent
    first_at: float  # perf_counter of its first text
    ended_at: float
    tokens: int


async def _one_stream(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> StreamTimes:
    body = {"prompt": prompt, "max_new_tokens": max_tokens, "temperature": 0, "stream": True}
    sent = time.perf_counter()
    first_at = 0.0
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                raise RuntimeError(f"the stream failed: {chunk['error']}")
            if not first_at and chunk.get("text_delta"):
                first_at = time.perf_counter()
            if chunk.get("done"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return StreamTimes(first_at - sent, first_at, time.perf_counter(), tokens)


async def _served_round(base_url: str, model: str, prompts: list[str], max_tokens: int) -> Measurement:
    url = f"{base_url}/v1/generate/{model.replace('/', '__')}"
    async with httpx.AsyncClient(timeout=300) as client:
        streams = await asyncio.gather(*(_one_stream(client, url, prompt, max_tokens) for prompt in prompts))
    window = max(s.ended_at for s in streams) - min(s.first_at for s in streams)
    tokens = sum(max(0, s.tokens - 1) for s in streams)
    return Measurement(statistics.median(s.first_token_s for s in streams), tokens / window if window > 0 else 0.0)


def served(base_url: str, model: str, prompts: list[str], max_tokens: int) -> Measurement:
    """N streamed /v1/generate requests at once, greedy; see the module docstring for what is counted."""
    return asyncio.run(_served_round(base_url, model, prompts, max_tokens))


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


def report(
    args: argparse.Namespace,
    files: PreparedFiles,
    config: dict,
    raw: dict[int, list[Measurement]],
    ours: dict[int, list[Measurement]],
) -> None:
    size_mb = files.graph.stat().st_size / 1e6
    print(f"{args.model}, {args.threads} intra-op threads, up to {args.max_tokens} tokens per stream, greedy;")
    print(f"graph {size_mb:.0f} MB ({config.get('torch_dtype')}); median of {args.rounds} rounds")
    print("| streams | raw: first token | raw: tokens/s | served: first token | served: tokens/s | served/raw |")
    print("|---|---|---|---|---|---|")
    for streams in args.streams:
        raw_ttft = statistics.median(m.first_token_s for m in raw[streams]) * 1000
        raw_rate = statistics.median(m.tokens_per_s for m in raw[streams])
        if not ours[streams]:
            print(f"| {streams} | {raw_ttft:.0f} ms | {raw_rate:.1f} | - | - | - |")
            continue
        ttft = statistics.median(m.first_token_s for m in ours[streams]) * 1000
        rate = statistics.median(m.tokens_per_s for m in ours[streams])
        pairs = zip(ours[streams], raw[streams], strict=True)
        ratio = statistics.median(o.tokens_per_s / r.tokens_per_s for o, r in pairs)
        print(f"| {streams} | {raw_ttft:.0f} ms | {raw_rate:.1f} | {ttft:.0f} ms | {rate:.1f} | {ratio:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--conversion", action="store_true", help="also time one GGUF→ONNX conversion")
    parser.add_argument("--raw-only", action="store_true", help="measure the raw loop only (no server)")
    args = parser.parse_args(argv)
    files, gguf = prepare(args.model)
    config = json.loads((files.model_dir / CONFIG_FILE).read_text())
    tokenizer = Tokenizer.from_file(str(files.tokenizer_dir / TOKENIZER_FILE))
    session = make_session(files.graph, args.threads)
    shape = CacheShape.from_config(config)
    pad_id = int(config.get("pad_token_id", 0))
    texts = [chatml(QUESTIONS[i % len(QUESTIONS)]) for i in range(max(args.streams))]
    prompts = [tokenizer.encode(text).ids for text in texts]
    decode_batch(session, prompts[:1], shape, 4, pad_id)  # warm-up
    raw: dict[int, list[Measurement]] = {streams: [] for streams in args.streams}
    ours: dict[int, list[Measurement]] = {streams: [] for streams in args.streams}
    with tempfile.TemporaryDirectory() as scratch:
        server = None
        if not args.raw_only:
            env = {**os.environ, "SIE_ORT_INTRA_OP_THREADS": str(args.threads)}
            server, base_url = start_all([], env, Path(scratch) / "server.log")
            served(base_url, args.model, texts[:1], 4)  # loads the model and warms it up
        try:
            for round_index in range(args.rounds):
                print(f"round {round_index + 1}/{args.rounds}", file=sys.stderr)
                for streams in args.streams:
                    raw[streams].append(decode_batch(session, prompts[:streams], shape, args.max_tokens, pad_id))
                    if server is not None:
                        ours[streams].append(served(base_url, args.model, texts[:streams], args.max_tokens))
        finally:
            if server is not None:
                server.stop()
    report(args, files, config, raw, ours)
    if args.conversion:
        print(f"GGUF→ONNX conversion (float32): {conversion_seconds(gguf):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
