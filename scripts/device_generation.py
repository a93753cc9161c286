"""Generation's device path, checked where it runs: a random Llama (or, `--family qwen3_5`, a Qwen3.5: linear-attention
layers whose states ride in the cache beside the keys and values; `--family gemma4`, a Gemma 4: caches of two head
sizes, and layers that keep none) checkpoint written here (safetensors by hand, no torch), converted in the
precision a GPU profile gets, and its decode steps run two ways on the same batch of rows:
through the engine's IO-bound runs (`sie.worker.generation.decoder_run`: the key/value cache fed back as the device
values the last run returned) and through plain `session.run` (the cache copied to the host and back every step).
Both must give the same logits step by step; the decode steps per second of each are printed side by side, medians
of interleaved rounds. `scripts/device_check.sh` runs it on cuda:0 in float16; the test suite on the CPU.

    python scripts/device_generation.py [--device cuda:0|cpu] [--precision float16|float32] [--rows 8]
        [--prompt 512] [--steps 64] [--rounds 3] [--hidden 1024] [--layers 8] [--family llama|qwen3_5|gemma4]

Exit status 1 when the two ways' logits differ.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from sie.worker.convert.decoders import convert_decoder_checkpoint
from sie.worker.convert.names import CONFIG_FILE, GRAPH_FILE
from sie.worker.generation.decoder_run import DecoderRun
from sie.worker.generation.kv_cache import BatchCache, CacheShape, next_cache
from sie.worker.session import SessionOptions, create_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.bert_reference import write_safetensors  # noqa: E402

VOCAB = 4096
# logits of the two ways, as a share of the logits' scale: the same graph on the same inputs
TOLERANCE = 1e-3


def write_checkpoint(directory: Path, family: str, hidden: int, layers: int, seed: int = 0) -> None:
    """A `family` checkpoint with random weights: config.json and model.safetensors."""
    config, shapes = FAMILY_SHAPES[family](hidden, layers)
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    tensors = {
        name: (np.ones(shape) if len(shape) == 1 else rng.normal(0.0, 0.5 / np.sqrt(shape[-1]), shape), "F32")
        for name, shape in shapes.items()
    }
    write_safetensors(directory / "model.safetensors", tensors)


def qwen3_5_shapes(hidden: int, layers: int) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """A Qwen3.5 text model's config and tensor shapes: every fourth layer attends (gated, a quarter of each 256-wide
    head rotated), the others run the gated delta rule (16 key heads serving 32 value heads of 128)."""
    heads, kv_heads, head_dim, intermediate = max(1, hidden // 256), 1, 256, hidden * 3
    key_heads, value_heads, key_dim, value_dim, kernel = 16, 32, 128, 128, 4
    channels = 2 * key_heads * key_dim + value_heads * value_dim
    types = ["full_attention" if (index + 1) % 4 == 0 else "linear_attention" for index in range(layers)]
    config = {"model_type": "qwen3_5_text", "hidden_size": hidden, "intermediate_size": intermediate,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
              "num_hidden_layers": layers, "layer_types": types, "vocab_size": VOCAB, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
              "linear_num_key_heads": key_heads, "linear_num_value_heads": value_heads,
              "linear_key_head_dim": key_dim, "linear_value_head_dim": value_dim, "linear_conv_kernel_dim": kernel,
              "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,)}
    for layer, kind in enumerate(types):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "mlp.gate_proj.weight": (intermediate, hidden),
            prefix + "mlp.up_proj.weight": (intermediate, hidden),
            prefix + "mlp.down_proj.weight": (hidden, intermediate),
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "post_attention_layernorm.weight": (hidden,),
        }
        if kind == "full_attention":
            shapes |= {
                prefix + "self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
                prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                prefix + "self_attn.q_norm.weight": (head_dim,),
                prefix + "self_attn.k_norm.weight": (head_dim,),
            }
        else:
            shapes |= {
                prefix + "linear_attn.in_proj_qkv.weight": (channels, hidden),
                prefix + "linear_attn.in_proj_z.weight": (value_heads * value_dim, hidden),
                prefix + "linear_attn.in_proj_b.weight": (value_heads, hidden),
                prefix + "linear_attn.in_proj_a.weight": (value_heads, hidden),
                prefix + "linear_attn.conv1d.weight": (channels, 1, kernel),
                prefix + "linear_attn.dt_bias": (value_heads,),
                prefix + "linear_attn.A_log": (value_heads,),
                prefix + "linear_attn.norm.weight": (value_dim,),
                prefix + "linear_attn.out_proj.weight": (hidden, value_heads * value_dim),
            }
    return config, shapes


def gemma4_shapes(hidden: int, layers: int) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """A Gemma 4 text model's config and tensor shapes, E2B's parts: windowed layers (256-wide heads) between full
    ones (512-wide), the second half reading the first half's caches with double-wide MLPs, per-layer inputs of 64
    values per layer."""
    heads, kv_heads, intermediate, per_layer = max(1, hidden // 256), 1, hidden * 4, 64
    types = ["full_attention" if index % 2 else "sliding_attention" for index in range(layers)]
    shared = layers // 2
    config = {"model_type": "gemma4_text", "hidden_size": hidden, "intermediate_size": intermediate,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 256, "global_head_dim": 512,
              "num_hidden_layers": layers, "layer_types": types, "sliding_window": 512, "vocab_size": VOCAB,
              "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": per_layer,
              "num_kv_shared_layers": shared, "use_double_wide_mlp": True, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "final_logit_softcapping": 30.0,
              "bos_token_id": 2, "eos_token_id": 1}  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,),
        "model.embed_tokens_per_layer.weight": (VOCAB, layers * per_layer),
        "model.per_layer_model_projection.weight": (layers * per_layer, hidden),
        "model.per_layer_projection_norm.weight": (per_layer,),
    }  # fmt: skip
    for layer, kind in enumerate(types):
        prefix, head_dim = f"model.layers.{layer}.", 512 if kind == "full_attention" else 256
        width = 2 * intermediate if layer >= layers - shared else intermediate
        shapes |= {
            prefix + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            prefix + "self_attn.q_norm.weight": (head_dim,),
            prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            prefix + "mlp.gate_proj.weight": (width, hidden),
            prefix + "mlp.up_proj.weight": (width, hidden),
            prefix + "mlp.down_proj.weight": (hidden, width),
            prefix + "per_layer_input_gate.weight": (per_layer, hidden),
            prefix + "per_layer_projection.weight": (hidden, per_layer),
            prefix + "layer_scalar": (1,),
            **{prefix + f"{norm}.weight": (hidden,) for norm in ("input_layernorm", "post_attention_layernorm",
               "pre_feedforward_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")},
        }  # fmt: skip
        if layer < layers - shared:
            shapes |= {
                prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                prefix + "self_attn.k_norm.weight": (head_dim,),
            }
    return config, shapes


def llama_shapes(hidden: int, layers: int) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """A Llama's config and tensor shapes."""
    heads, kv_heads, intermediate = max(1, hidden // 64), max(1, hidden // 256), hidden * 11 // 4
    head_dim = hidden // heads
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
              "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "num_hidden_layers": layers, "vocab_size": VOCAB, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            prefix + "mlp.gate_proj.weight": (intermediate, hidden),
            prefix + "mlp.up_proj.weight": (intermediate, hidden),
            prefix + "mlp.down_proj.weight": (hidden, intermediate),
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "post_attention_layernorm.weight": (hidden,),
        }
    return config, shapes


FAMILY_SHAPES: Final = {"llama": llama_shapes, "qwen3_5": qwen3_5_shapes, "gemma4": gemma4_shapes}


def prompts(rows: int, longest: int, seed: int = 1) -> list[np.ndarray]:
    """`rows` prompts of different lengths, the longest `longest` tokens."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, longest - (row * longest) // (2 * rows)) for row in range(rows)]


def plain_step(session: Any, names: list[str]) -> Callable[[dict], tuple[np.ndarray, dict]]:
    def run(feeds: dict) -> tuple[np.ndarray, dict]:
        outputs = session.run(None, feeds)
        return outputs[names.index("logits")], next_cache(names, outputs)

    return run


def decode(run: Callable[[dict], tuple[np.ndarray, dict]], feeds: dict, steps: int) -> list[np.ndarray]:
    """A prefill of `feeds`, then `steps` greedy steps of every row: the logits of each run."""
    logits, present = run(feeds)
    batch, seen = BatchCache(present, feeds["attention_mask"]), [logits]
    for _ in range(steps):
        logits, present = run(batch.step_feeds(logits[:, -1].argmax(axis=-1).tolist()))
        batch = batch.advanced(present)
        seen.append(logits)
    return seen


def steps_per_second(run: Callable[[dict], tuple[np.ndarray, dict]], feeds: dict, steps: int) -> float:
    started = time.perf_counter()
    decode(run, feeds, steps)
    return (steps + 1) / (time.perf_counter() - started)


def interleaved_medians(rates: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each way's rate, measured in turn in each of `rounds` rounds: the medians, by way."""
    measured: dict[str, list[float]] = {name: [] for name in rates}
    for _ in range(rounds):
        for name, rate in rates.items():
            measured[name].append(rate())
    return {name: statistics.median(values) for name, values in measured.items()}


def print_side_by_side(unit: str, medians: Mapping[str, float], rounds: int) -> None:
    """One line: each way's median rate, and the first's over the second's."""
    (first, ours), (second, theirs) = list(medians.items())[:2]
    print(f"{unit} (medians of {rounds}): {first} {ours:.2f}, {second} {theirs:.2f}: {ours / theirs:.2f}x")


def verdict(difference: float, tolerance: float, failure: str) -> int:
    """The exit status: 1, with `failure` on stderr, when the two ways differ by more than `tolerance`; else 0."""
    if difference <= tolerance:
        return 0
    print(f"FAIL: {failure}", file=sys.stderr)
    return 1


def parsed_on_device(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parser`'s arguments with the ones every device script takes (where, in what precision, the random model's
    size, the rounds), the device's libraries loaded."""
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--precision", default="float16", choices=("float16", "float32"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        from sie.worker.devices import load_cuda_libraries

        load_cuda_libraries()  # as `sie run` does before its first CUDA session
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512, help="the longest prompt's tokens")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--family", default="llama", choices=sorted(FAMILY_SHAPES))
    args = parsed_on_device(parser, argv)
    with tempfile.TemporaryDirectory(prefix="sie-device-generation-") as scratch:
        write_checkpoint(Path(scratch) / "checkpoint", args.family, args.hidden, args.layers)
        convert_decoder_checkpoint(Path(scratch) / "checkpoint", Path(scratch) / "decoder", args.precision)
        session = create_session(Path(scratch) / "decoder" / GRAPH_FILE, SessionOptions(device=args.device))
        config = json.loads((Path(scratch) / "decoder" / CONFIG_FILE).read_text())
    shape = CacheShape.from_config(config)
    feeds = BatchCache.prompt_feeds(prompts(args.rows, args.prompt), shape)
    names = [output.name for output in session.get_outputs()]
    ways = {"io-bound": DecoderRun(session), "session.run": plain_step(session, names)}
    print(f"{args.family}, {args.hidden} wide, {args.layers} layers, {args.precision} on {session.get_providers()[0]}; "
          f"{args.rows} rows, prompts up to {args.prompt} tokens, {args.steps} decode steps")  # fmt: skip
    bound, plain = (decode(run, feeds, 4) for run in ways.values())
    scale = max(1.0, float(np.abs(plain[0]).max()))
    difference = max(float(np.abs(ours - theirs).max()) for ours, theirs in zip(bound, plain, strict=True)) / scale
    print(f"logits of the two ways, prefill and 4 steps: max difference {difference:.1e} of their scale")
    rates = {name: functools.partial(steps_per_second, run, feeds, args.steps) for name, run in ways.items()}
    print_side_by_side("decode steps/s", interleaved_medians(rates, args.rounds), args.rounds)
    return verdict(difference, TOLERANCE, "the io-bound runs' logits differ from session.run's")


if __name__ == "__main__":
    raise SystemExit(main())
