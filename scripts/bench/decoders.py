"""Each converted decoder family under onnxruntime against transformers (torch) on the same checkpoint, side by side
in one run: a random model of the family at SmolLM2-135M's width (hidden 576, 9 query / 3 key-value heads, MLP 1536,
a 49,152-token vocabulary; `--layers` layers) saved by transformers and converted by `sie.worker.convert`, both
given the same threads, medians of interleaved rounds.

    .venv/bin/python scripts/bench/decoders.py [--families llama,qwen3,...] [--rounds 3] [--threads 2] [--served]

Per family:
- prefill: one prompt of `--prompt` tokens through the generation graph (cache out) vs `model(ids, use_cache=True)`;
- decode: `--streams` sequences (prompts of `--prompt` tokens, already prefilled) stepped `--steps` greedy tokens
  together through the key/value cache, tokens/s over the steps, vs torch's cached steps (goal ≥ 1.5×);
- embed: a batch of 32 × `--prompt` tokens through the hidden-state graph vs the bare model's forward.
Prints milliseconds (or tokens/s) per side and torch time / ours. Needs the test extra (torch, transformers).

With `--served`, a second table: each family's bare model (with a word-level tokenizer that ends texts with its end
token) served as a last-token embedder through the public `qwen2_flash` module by one `sie run --role all`, 32 wrk
connections × one text of `--prompt` tokens, against the same hidden-state graph in-process at batch 32 (tokens
already made), interleaved rounds; the goal is ≥ 0.9. (Served generation against the raw decode loop is
`scripts/bench/generate.py`: the same engine serves every decoder family.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "scripts" / "bench"))
from served_vs_raw import CONNECTIONS, served_vs_raw, timed  # noqa: E402

from sie.catalog import dump_yaml  # noqa: E402
from sie.worker.convert import convert_decoder_checkpoint, convert_decoder_hidden  # noqa: E402
from sie.worker.generation.kv_cache import CacheShape, empty_cache, next_cache  # noqa: E402
from support.decoder_checkpoints import FAMILIES, WORDS, family_config, gemma4_config, write_tokenizer  # noqa: E402

EMBEDDER = "sie_server.adapters.qwen2_flash:Qwen2FlashAdapter"

SIZE = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "vocab_size": 49152, "max_position_embeddings": 2048}  # fmt: skip


def sized_model(family: str, layers: int) -> torch.nn.Module:
    if family == "gemma4":  # E2B's proportions: windowed layers around full ones with heads twice as wide, the last
        # half reading earlier layers' caches with double-wide MLPs, per-layer inputs of 64 values per layer
        config = gemma4_config(**SIZE, num_hidden_layers=layers, head_dim=64, global_head_dim=128,
                               layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * (layers // 4),
                               num_kv_shared_layers=layers // 2, hidden_size_per_layer_input=64,
                               vocab_size_per_layer_input=SIZE["vocab_size"], sliding_window=4096)  # fmt: skip
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config).eval()
    config = family_config(family)
    for key, value in SIZE.items():
        setattr(config, key, value)
    config.num_hidden_layers = layers
    if hasattr(config, "head_dim"):
        config.head_dim = 64
    if family == "qwen3_5":  # three linear-attention layers to each attention one, Qwen3.5-0.8B's ratio of heads
        config.layer_types = [
            "full_attention" if (index + 1) % 4 == 0 else "linear_attention" for index in range(layers)
        ]
        config.linear_num_key_heads, config.linear_num_value_heads = 4, 8
        config.linear_key_head_dim = config.linear_value_head_dim = 64
    elif hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[:1] * layers
    if getattr(config, "sliding_window", None):
        config.sliding_window = 4096  # longer than the bench's sequences: the mask is built, nothing is cut
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


class Ours:
    """The converted graphs of one checkpoint in onnxruntime."""

    def __init__(self, directory: Path, threads: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        generation = convert_decoder_checkpoint(directory, directory / "decoder")
        convert_decoder_hidden(directory, directory / "hidden.onnx")
        self.decoder = ort.InferenceSession(str(generation.graph), options, providers=["CPUExecutionProvider"])
        self.hidden = ort.InferenceSession(str(directory / "hidden.onnx"), options, providers=["CPUExecutionProvider"])
        self.shape = CacheShape.from_config(json.loads((generation.directory / "config.json").read_text()))
        self.names = [output.name for output in self.decoder.get_outputs()]

    def step(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **cache}
        outputs = self.decoder.run(None, feeds)
        return outputs[self.names.index("logits")][:, 0], next_cache(self.names, outputs)

    def prefill(self, ids: np.ndarray) -> tuple[np.ndarray, dict]:
        mask = np.ones_like(ids)
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
        return self.step(ids, mask, positions, empty_cache(self.shape, ids.shape[0]))

    def decode(self, ids: np.ndarray, steps: int) -> None:
        logits, cache = self.prefill(ids)
        mask = np.ones_like(ids)
        positions = np.full((ids.shape[0], 1), ids.shape[1])
        for _ in range(steps):
            token = logits.argmax(axis=1)[:, None].astype(np.int64)
            mask = np.concatenate([mask, np.ones_like(token)], axis=1)
            logits, cache = self.step(token, mask, positions, cache)
            positions = positions + 1

    def embed(self, ids: np.ndarray) -> None:
        self.hidden.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})


def torch_decode(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> None:
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        for _ in range(steps):
            token = logits.argmax(dim=-1, keepdim=True)
            out = model(token, past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]


def measure(
    ours: Ours, model: torch.nn.Module, inputs: tuple[np.ndarray, np.ndarray, np.ndarray], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Milliseconds per round of each cell, ours and torch's (`_t`) interleaved."""
    prompt, streams, batch = inputs
    cells: dict[str, list[float]] = {key: [] for key in ("prefill", "prefill_t", "decode", "decode_t", "embed",
                                                         "embed_t")}  # fmt: skip
    with torch.inference_mode():
        for _ in range(args.rounds):
            cells["prefill"].append(timed(lambda: ours.prefill(prompt), args.repeats))
            cells["prefill_t"].append(timed(lambda: model(torch.from_numpy(prompt), use_cache=True), args.repeats))
            # decode: the whole loop less its prefill, timed apart
            base = timed(lambda: ours.prefill(streams), 1)
            cells["decode"].append(timed(lambda: ours.decode(streams, args.steps), 1) - base)
            base_t = timed(lambda: model(torch.from_numpy(streams), use_cache=True), 1)
            loop_t = timed(lambda: torch_decode(model, torch.from_numpy(streams), args.steps), 1)
            cells["decode_t"].append(loop_t - base_t)
            cells["embed"].append(timed(lambda: ours.embed(batch), args.repeats))
            cells["embed_t"].append(timed(lambda: model.model(torch.from_numpy(batch)), args.repeats))
    return cells


def write_served_yaml(models_dir: Path, family: str, weights: Path, tokens: int) -> None:
    """The family's catalogue entry: a last-token embedder over `weights`, batches of up to 32 texts of `tokens`."""
    data = {
        "sie_id": f"bench/{family}",
        "weights_path": str(weights),
        "max_sequence_length": tokens,
        "tasks": {"encode": {"dense": {"dim": SIZE["hidden_size"]}}},
        "profiles": {"default": {"adapter_path": EMBEDDER, "max_batch_tokens": CONNECTIONS * tokens,
                                 "adapter_options": {"runtime": {"pooling": "last", "normalize": True}}}},
    }  # fmt: skip
    models_dir.mkdir(exist_ok=True)
    (models_dir / f"bench__{family}.yaml").write_text(dump_yaml(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per round and side")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed after the prefill")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--served", action="store_true", help="also the served-vs-raw embedding table (needs wrk)")
    parser.add_argument("--served-seconds", type=int, default=6, help="measured wrk seconds per family and round")
    parser.add_argument("--skip-torch", action="store_true", help="only the served table")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, SIZE["vocab_size"], size=(1, args.prompt))
    streams = rng.integers(10, SIZE["vocab_size"], size=(args.streams, args.prompt))
    batch = rng.integers(10, SIZE["vocab_size"], size=(32, args.prompt))
    rows = []
    graphs: dict[str, Ours] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.families.split(","):
            directory = Path(scratch) / family
            model = sized_model(family, args.layers)
            model.save_pretrained(directory)
            ours = Ours(directory, args.threads)
            graphs[family] = ours
            if args.served:
                model.model.save_pretrained(Path(scratch) / "bare" / family)
                write_tokenizer(Path(scratch) / "bare" / family, end_with_eos=True)
                write_served_yaml(Path(scratch) / "models", family, Path(scratch) / "bare" / family, args.prompt)
            if not args.skip_torch:
                cells = measure(ours, model, (prompt, streams, batch), args)
                rows.append((family, {key: statistics.median(values) for key, values in cells.items()}))
        if rows:
            print_table(rows, args)
        if args.served:
            text = " ".join(WORDS[index % len(WORDS)] for index in range(args.prompt - 1))  # + the end token
            runs = {family: ours.embed for family, ours in graphs.items()}
            served_vs_raw(Path(scratch), runs, text, len(WORDS), args.prompt, args.rounds, args.served_seconds,
                          {"SIE_ORT_INTRA_OP_THREADS": str(args.threads)})  # fmt: skip
    return 0


def print_table(rows: list[tuple[str, dict[str, float]]], args: argparse.Namespace) -> None:
    tokens = args.streams * args.steps
    print(f"\ndecoders at hidden 576, {args.layers} layers, {args.threads} threads; medians of {args.rounds} rounds")
    print(
        f"| family | prefill 1×{args.prompt} ms (ours / torch) | × | decode {args.streams} streams tok/s "
        f"(ours / torch) | × | embed 32×{args.prompt} ms (ours / torch) | × |"
    )
    print("|---|---|---|---|---|---|---|")
    for family, m in rows:
        decode, decode_t = tokens / (m["decode"] / 1000), tokens / (m["decode_t"] / 1000)
        print(f"| {family} | {m['prefill']:.1f} / {m['prefill_t']:.1f} | {m['prefill_t'] / m['prefill']:.2f} "
              f"| {decode:.0f} / {decode_t:.0f} | {decode / decode_t:.2f} "
              f"| {m['embed']:.0f} / {m['embed_t']:.0f} | {m['embed_t'] / m['embed']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
