"""Embedding pooling's device path, checked where it runs: the hidden-state graph of a random Llama checkpoint
(written by `device_generation.write_llama`, converted in the precision a GPU profile gets, as a decoder embedder
serves it) run two ways on the same batch: the host path (`session.run` copies every token's hidden state to the
host, numpy pools them: `sie.worker.outputs.pool`) and the device path (`sie.worker.device_pooling`: the states stay
where onnxruntime computed them and a pooling graph on the same device returns only the vectors). Both must give the
same vectors, for mean and last-token pooling; batches per second of each are printed side by side, medians of
interleaved rounds. `scripts/device_check.sh` runs it on cuda:0 in float16; the test suite on the CPU.

    python scripts/device_pooling.py [--device cuda:0|cpu] [--precision float16|float32] [--rows 32]
        [--tokens 256] [--rounds 3] [--seconds 3] [--hidden 1024] [--layers 8]

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
from device_generation import VOCAB, interleaved_medians, parsed_on_device, print_side_by_side, verdict, write_llama

from sie.worker.convert.decoder_graph import HIDDEN_STATE
from sie.worker.convert.decoders import convert_decoder_hidden
from sie.worker.convert.pooling import pooling_graph
from sie.worker.device_pooling import DevicePooling
from sie.worker.outputs import pool
from sie.worker.session import SessionOptions, create_session

# vectors of the two ways, as a share of their scale: the same graph, pooled in float32 both ways
TOLERANCE = 1e-5
MODES = ("mean", "last")


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
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per way and round")
    args = parsed_on_device(parser, argv)
    with tempfile.TemporaryDirectory(prefix="sie-device-pooling-") as scratch:
        write_llama(Path(scratch) / "checkpoint", args.hidden, args.layers)
        convert_decoder_hidden(Path(scratch) / "checkpoint", Path(scratch) / "hidden.onnx", args.precision)
        session = create_session(Path(scratch) / "hidden.onnx", SessionOptions(device=args.device))
    feeds = batch(args.rows, args.tokens)
    mask = feeds["attention_mask"]
    device = DevicePooling(session, HIDDEN_STATE, pooling_graph)

    def on_host() -> dict[str, np.ndarray]:
        (states,) = session.run([HIDDEN_STATE], feeds)
        return {mode: pool(states.astype(np.float32), mask, mode) for mode in MODES}

    def on_device() -> dict[str, np.ndarray]:
        return device.pooled(device.run(feeds)[0], mask, MODES)

    print(f"{args.hidden} wide, {args.layers} layers, {args.precision} on {session.get_providers()[0]}; "
          f"{args.rows} rows of up to {args.tokens} tokens")  # fmt: skip
    host, pooled = on_host(), on_device()
    scale = max(1.0, max(float(np.abs(vectors).max()) for vectors in host.values()))
    difference = max(float(np.abs(pooled[mode] - host[mode]).max()) for mode in MODES) / scale
    print(f"vectors of the two ways ({', '.join(MODES)}): max difference {difference:.1e} of their scale")
    ways = {"device pooling": on_device, "host pooling": on_host}
    rates = {name: functools.partial(per_second, run, args.seconds) for name, run in ways.items()}
    print_side_by_side("batches/s", interleaved_medians(rates, args.rounds), args.rounds)
    return verdict(difference, TOLERANCE, "the vectors pooled on the device differ from the host's")


if __name__ == "__main__":
    raise SystemExit(main())
