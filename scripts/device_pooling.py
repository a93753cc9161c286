"""Token states' device path, checked where it runs: the hidden-state graph of a random Llama checkpoint (written
by `device_generation.write_checkpoint`, converted in the precision a GPU profile gets, as a decoder embedder serves
it) run two ways on the same batch: the host path (`session.run` copies every token's hidden state to the host,
numpy works on them) and the device path (`sie.worker.device_pooling`: the states stay where onnxruntime computed
them and small graphs on the same device return only what is made of them). Two uses, each way:

- pooling: mean and last-token vectors (the host's `sie.worker.outputs.pool`);
- a token head: a ColBERT-style projection of every real token to `--head-width` numbers (the host's numpy
  `DenseStage` over each row's tokens, as the multi-vector adapter applies it).

Both ways must give the same vectors; batches per second of each are printed side by side, medians of interleaved
rounds. `scripts/device_check.sh` runs it on cuda:0 in float16; the test suite on the CPU.

    python scripts/device_pooling.py [--device cuda:0|cpu] [--precision float16|float32] [--rows 32]
        [--tokens 256] [--head-width 128] [--rounds 3] [--seconds 3] [--hidden 1024] [--layers 8]

Exit status 1 when the two ways' vectors differ.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from device_generation import (
    VOCAB,
    interleaved_medians,
    parsed_on_device,
    print_side_by_side,
    verdict,
    write_checkpoint,
)

from sie.worker.convert.decoder_graph import HIDDEN_STATE
from sie.worker.convert.decoders import convert_decoder_hidden
from sie.worker.convert.device_graphs import pooling_graph, token_head_graph
from sie.worker.device_pooling import DeviceGraphs, DevicePooling
from sie.worker.outputs import pool
from sie.worker.sentence_modules import DenseStage
from sie.worker.session import SessionOptions, create_session

# vectors of the two ways, as a share of their scale: the same graph, pooled in float32 both ways
TOLERANCE = 1e-5
MODES = ("mean", "last")
HEAD = "projection"


def batch(rows: int, longest: int, seed: int = 2) -> dict[str, np.ndarray]:
    """`rows` rows of different lengths up to `longest` tokens, right-padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (rows, longest))
    mask = np.zeros((rows, longest), dtype=np.int64)
    for row in range(rows):
        mask[row, : longest - (row * longest) // (2 * rows)] = 1
    return {"input_ids": ids * mask, "attention_mask": mask}


def per_second(run: Callable[[], object], seconds: float) -> float:
    run()  # warm-up
    started, count = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - started) < seconds and count < 100_000:
        run()
        count += 1
    return count / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256, help="the longest row's tokens")
    parser.add_argument("--head-width", type=int, default=128, help="the token head's width (a ColBERT's)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per way and round")
    args = parsed_on_device(parser, argv)
    with tempfile.TemporaryDirectory(prefix="sie-device-pooling-") as scratch:
        write_checkpoint(Path(scratch) / "checkpoint", "llama", args.hidden, args.layers)
        convert_decoder_hidden(Path(scratch) / "checkpoint", Path(scratch) / "hidden.onnx", args.precision)
        session = create_session(Path(scratch) / "hidden.onnx", SessionOptions(device=args.device))
    feeds = batch(args.rows, args.tokens)
    mask = feeds["attention_mask"]
    rng = np.random.default_rng(3)
    projection = DenseStage((rng.standard_normal((args.hidden, args.head_width)) / args.hidden**0.5).astype(np.float32),
                            None, "Identity")  # fmt: skip
    graphs = DeviceGraphs(pooling_graph, token_head_graph)
    device = DevicePooling(session, HIDDEN_STATE, graphs, {HEAD: (projection,)})
    rows = [mask[row].astype(bool) for row in range(len(mask))]

    def pooled_on_host() -> dict[str, np.ndarray]:
        (states,) = session.run([HIDDEN_STATE], feeds)
        return {mode: pool(states.astype(np.float32), mask, mode) for mode in MODES}

    def pooled_on_device() -> dict[str, np.ndarray]:
        return device.pooled(device.run(feeds)[0], mask, MODES)

    def projected_on_host() -> list[np.ndarray]:
        (states,) = session.run([HIDDEN_STATE], feeds)
        return [projection(states[row][kept]) for row, kept in enumerate(rows)]

    def projected_on_device() -> list[np.ndarray]:
        vectors = device.through_head(device.run(feeds)[0], HEAD)
        return [vectors[row][kept] for row, kept in enumerate(rows)]

    print(f"{args.hidden} wide, {args.layers} layers, {args.precision} on {session.get_providers()[0]}; "
          f"{args.rows} rows of up to {args.tokens} tokens")  # fmt: skip
    host, pooled = pooled_on_host(), pooled_on_device()
    scale = max(1.0, max(float(np.abs(vectors).max()) for vectors in host.values()))
    difference = max(float(np.abs(pooled[mode] - host[mode]).max()) for mode in MODES) / scale
    print(f"vectors of the two ways ({', '.join(MODES)}): max difference {difference:.1e} of their scale")
    host_tokens, device_tokens = projected_on_host(), projected_on_device()
    scale = max(1.0, max(float(np.abs(vectors).max()) for vectors in host_tokens))
    head_difference = max(float(np.abs(ours - theirs).max()) for ours, theirs in zip(device_tokens, host_tokens,
                                                                                      strict=True)) / scale  # fmt: skip
    print(f"token vectors of the two ways ({args.head_width}-wide projection): max difference {head_difference:.1e} "
          "of their scale")  # fmt: skip
    ways = {"device pooling": pooled_on_device, "host pooling": pooled_on_host,
            "device projection": projected_on_device, "host projection": projected_on_host}  # fmt: skip
    rates = {name: functools.partial(per_second, run, args.seconds) for name, run in ways.items()}
    medians = interleaved_medians(rates, args.rounds)
    for pair in (("device pooling", "host pooling"), ("device projection", "host projection")):
        print_side_by_side("batches/s", {name: medians[name] for name in pair}, args.rounds)
    return verdict(max(difference, head_difference), TOLERANCE, "the device path's vectors differ from the host's")


if __name__ == "__main__":
    raise SystemExit(main())
