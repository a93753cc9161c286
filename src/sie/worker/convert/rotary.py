"""Rotary position embeddings and the self-attention block of the rotary encoder families (ModernBERT, GTE,
NomicBERT): Q, K and V projected (the checkpoint's fused projection read as its three parts) with 1/sqrt(head_size)
folded into Q, Q and K rotated by their position (the rotate-half layout of GPT-NeoX and transformers: the
frequencies repeated over the two halves of a head), an additive attention bias (padding, a local window), softmax,
and the output projection.

The hidden state stays a [B*S, H] matrix, as in `encoder_graph`, so onnxruntime fuses every projection into a Gemm.
Three projections rather than one fused one and a split, and onnxruntime's `RotaryEmbedding` rather than the
rotation spelled out (split, negate, concatenate, multiply, add), each save passes over the activations: the
attention block is a fifth of a ModernBERT's time on a CPU (scripts/bench/families.py).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import linear, row_heads
from sie.worker.convert.graph_builder import CONTRIB_DOMAIN, GraphBuilder


def inverse_frequencies(head_size: int, theta: float, ntk_factor: float = 1.0) -> np.ndarray:
    """The rotary frequency of each pair of dimensions, [head_size / 2], float32 as the modeling code computes them;
    fixed NTK scaling (GTE's) raises the base by `factor` and divides by `factor ** (2 / head_size)`."""
    exponents = np.arange(0, head_size, 2, dtype=np.float32) / np.float32(head_size)
    inverse = (np.float32(1.0) / np.float32(theta * ntk_factor) ** exponents).astype(np.float32)
    if ntk_factor != 1.0:
        inverse = (inverse / np.float32(ntk_factor ** (2 / head_size))).astype(np.float32)
    return inverse


def rotary_tables(b: GraphBuilder, steps: str, inverse: np.ndarray, name: str) -> tuple[str, str]:
    """cos and sin of every position in `steps` (int64 [S]), [S, head_size / 2]: one per pair of dimensions, as
    onnxruntime's `RotaryEmbedding` reads them."""
    positions = b.op("Cast", [b.op("Unsqueeze", [steps, b.const([1])], f"{name}.positions")], f"{name}.float",
                     to=TensorProto.FLOAT)  # fmt: skip
    angles = b.op("Mul", [positions, b.const(inverse, np.float32)], f"{name}.angles")
    return b.op("Cos", [angles], f"{name}.cos"), b.op("Sin", [angles], f"{name}.sin")


def _whole_heads(b: GraphBuilder, rotary: tuple[str, str], name: str) -> tuple[str, str]:
    """The tables over a whole head, [S, head_size]: each pair's frequency in both halves."""
    cos, sin = rotary
    return (b.op("Concat", [cos, cos], f"{name}.cos_whole", axis=1),
            b.op("Concat", [sin, sin], f"{name}.sin_whole", axis=1))  # fmt: skip


def rotated(b: GraphBuilder, x: str, rotary: tuple[str, str], heads: int, name: str) -> str:
    """[B, S, H] rotated head by head at positions 0 … S-1 (onnxruntime's fused `RotaryEmbedding`)."""
    return b.op("RotaryEmbedding", [x, b.const([0]), *rotary], name, domain=CONTRIB_DOMAIN, num_heads=heads,
                interleaved=0)  # fmt: skip


def rotate_half(b: GraphBuilder, x: str, cos: str, sin: str, head_size: int, name: str) -> str:
    """x * cos + rotate_half(x) * sin over the last axis of [B, heads, S, head_size]."""
    half = head_size // 2
    first, second = b.op_multi("Split", [x, b.const([half, half])], [f"{name}.x1", f"{name}.x2"], axis=-1)
    negated = b.op("Neg", [second], f"{name}.neg")
    rotated = b.op("Concat", [negated, first], f"{name}.rotated", axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos], f"{name}.cos"), b.op("Mul", [rotated, sin], f"{name}.sin")], name)


def qkv_heads_shape(b: GraphBuilder, heads: int, head_size: int) -> tuple[str, str]:
    """[-1, S, H] and [-1, S, heads, head_size]: a projection of [B*S, H] as sequences, and split into heads."""
    sequence = b.op("Shape", ["input_ids"], "shape.sequence", start=1, end=2)
    return (b.op("Concat", [b.const([-1]), sequence, b.const([heads * head_size])], "shape.sequences", axis=0),
            b.op("Concat", [b.const([-1]), sequence, b.const([heads, head_size])], "shape.heads", axis=0))  # fmt: skip


def rotary_attention(  # noqa: PLR0913 - one attention block's parts
    b: GraphBuilder,
    x: str,
    qkv: tuple[np.ndarray, np.ndarray],
    out: tuple[np.ndarray, np.ndarray],
    shapes: tuple[str, str],
    rotary: tuple[str, str],
    bias: str,
    head_size: int,
    name: str,
) -> str:
    """Self-attention of [B*S, H] tokens: `qkv` is the fused projection as `(weight [H, 3H], bias [3H])`, Q then K
    then V; `shapes` are `qkv_heads_shape`'s, `rotary` `rotary_tables`'; `bias` is added to the scores ([B or 1, 1,
    S or 1, S]); returns the output projection's [B*S, H]."""
    width = qkv[0].shape[0]
    heads = width // head_size
    sequences, split_heads = shapes
    scale = np.float32(head_size**-0.5)  # on Q before the rotation: the rotation is linear
    parts = {"q": (qkv[0][:, :width] * scale, qkv[1][:width] * scale),
             "k": (qkv[0][:, width : 2 * width], qkv[1][width : 2 * width]),
             "v": (qkv[0][:, 2 * width :], qkv[1][2 * width :])}  # fmt: skip
    projected = {part: b.op("Reshape", [linear(b, x, parts[part], f"{name}.{part}"), sequences], f"{name}.{part}_seq")
                 for part in "qkv"}  # fmt: skip
    q, k = (rotated(b, projected[part], rotary, heads, f"{name}.{part}_rot") for part in "qk")

    def heads_of(x: str, part: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [x, split_heads], f"{name}.{part}_heads")], f"{name}.{part}_t",
                    perm=perm)  # fmt: skip

    # [B, heads, S, d] queries and values, the keys transposed once to [B, heads, d, S]
    k_t = heads_of(k, "k", [0, 2, 3, 1])
    return _scores_to_output(b, heads_of(q, "q", [0, 2, 1, 3]), k_t, heads_of(projected["v"], "v", [0, 2, 1, 3]),
                             bias, out, name)  # fmt: skip


def _attend(  # noqa: PLR0913 - one attention block's parts
    b: GraphBuilder,
    query: str,
    keys_values: tuple[str, str],
    rotary: tuple[str, str],
    bias: str,
    head_size: int,
    out: tuple[np.ndarray, np.ndarray],
    name: str,
) -> str:
    """The rotated queries [B, heads, Q, d] against the keys (rotated here) and values [B, heads, S, d], `bias` added
    to the scores; the output projection's [B*Q, H]."""
    k, v = keys_values
    k = rotate_half(b, k, *rotary, head_size, f"{name}.k_rot")
    k_t = b.op("Transpose", [k], f"{name}.k_t", perm=[0, 1, 3, 2])
    return _scores_to_output(b, query, k_t, v, bias, out, name)


def _scores_to_output(  # noqa: PLR0913 - one attention block's parts
    b: GraphBuilder, query: str, k_t: str, v: str, bias: str, out: tuple[np.ndarray, np.ndarray], name: str
) -> str:
    """Queries [B, heads, Q, d] against keys [B, heads, d, S] (`bias` added), over values [B, heads, S, d]: the
    output projection's [B*Q, H]."""
    scores = b.op("Add", [b.op("MatMul", [query, k_t], f"{name}.scores"), bias], f"{name}.masked")
    probs = b.op("Softmax", [scores], f"{name}.probs", axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, v], f"{name}.context")], f"{name}.context_t",
                   perm=[0, 2, 1, 3])  # fmt: skip
    context = b.op("Reshape", [context, b.const([-1, out[0].shape[0]])], f"{name}.merged")
    return linear(b, context, out, f"{name}.out")


def rotary_rows_attention(  # noqa: PLR0913 - one attention block's parts
    b: GraphBuilder,
    x: str,
    selected: str,
    rows: str,
    qkv: tuple[np.ndarray, np.ndarray],
    out: tuple[np.ndarray, np.ndarray],
    rotary: tuple[str, str],
    bias: str,
    head_size: int,
    name: str,
) -> str:
    """`rotary_attention` for the queries at the int64 [B, P] positions `rows` alone: `selected` is `x` there,
    [B*P, H]; their queries (rotated at their positions) against every token's keys and values; `bias` is added to
    the scores ([B, 1, 1 or P, S]); returns the output projection's [B*P, H]."""
    width = qkv[0].shape[0]
    heads = width // head_size
    scale = np.float32(head_size**-0.5)
    query = linear(b, selected, (qkv[0][:, :width] * scale, qkv[1][:width] * scale), f"{name}.q")
    query = row_heads(b, query, rows, heads, head_size, f"{name}.q")  # [B, heads, P, d]
    keys_values = linear(b, x, (qkv[0][:, width:], qkv[1][width:]), f"{name}.kv")
    kv_shape = b.op("Concat", [b.op("Shape", ["input_ids"], f"{name}.batch_sequence"), b.const([2, heads, head_size])],
                    f"{name}.kv_shape", axis=0)  # fmt: skip
    split = b.op("Transpose", [b.op("Reshape", [keys_values, kv_shape], f"{name}.kv_heads")], f"{name}.kv_t",
                 perm=[2, 0, 3, 1, 4])  # [2, B, heads, S, d]  # fmt: skip
    parts = b.op_multi("Split", [split], [f"{name}.k5d", f"{name}.v5d"], axis=0)
    k, v = (b.op("Squeeze", [part, b.const([0])], f"{name}.{p}") for part, p in zip(parts, "kv", strict=True))
    rotary = _whole_heads(b, rotary, name)
    cos, sin = rotary  # [S, d]; the queries' rows of them, [B, 1, P, d]
    row_cos, row_sin = (b.op("Unsqueeze", [b.op("Gather", [table, rows], f"{name}.{kind}_rows"), b.const([1])],
                             f"{name}.{kind}_rows_4d") for kind, table in (("cos", cos), ("sin", sin)))  # fmt: skip
    query = rotate_half(b, query, row_cos, row_sin, head_size, f"{name}.q_rot")
    return _attend(b, query, (k, v), rotary, bias, head_size, out, name)
