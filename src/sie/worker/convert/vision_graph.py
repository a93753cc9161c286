"""The layers of the image–text towers that `clip.py` assembles: the pre-LayerNorm transformer layer CLIP and SigLIP
share in both towers (self-attention in plain ONNX operators under an optional additive mask, then the MLP with the
config's activation), a ViT's patch embedding (a strided Conv, flattened to tokens), and SigLIP's attention-pooling
head (a learned probe attending over the image tokens through torch's `nn.MultiheadAttention`, then an MLP).

Read from transformers' `models/clip/modeling_clip.py` (CLIPEncoderLayer, CLIPAttention, CLIPMLP,
CLIPVisionEmbeddings), `models/siglip/modeling_siglip.py` (SiglipVisionEmbeddings,
SiglipMultiheadAttentionPoolingHead) and `activations.py` (quick_gelu, gelu, gelu_pytorch_tanh). Tokens travel as a
[batch * sequence, hidden] matrix, so onnxruntime turns each Linear's MatMul + Add into one Gemm. numpy and onnx only.
"""

from __future__ import annotations

import attrs
import numpy as np

from sie.worker.convert.encoder_graph import gelu
from sie.worker.convert.graph_builder import CONTRIB_DOMAIN, GraphBuilder
from sie.worker.convert.head_layers import HeadWeights, linear

# transformers' names of the activations built (`gelu_new` is the same tanh approximation as `gelu_pytorch_tanh`).
ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh", "gelu_new")
QUICK_GELU_SCALE = 1.702


@attrs.frozen
class TowerConfig:
    """One tower's (text or vision) transformer: widths, depth, heads, LayerNorm epsilon and MLP activation."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    activation: str  # one of ACTIVATIONS

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


def activation(b: GraphBuilder, x: str, kind: str, name: str) -> str:
    """transformers' ACT2FN[kind]: quick_gelu x·σ(1.702x) and the tanh approximation
    0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as onnxruntime's own kernels (`QuickGelu`, `FastGelu`: one pass over
    the activations, on CPU and CUDA), erf `gelu` spelled so onnxruntime fuses it into `Gelu` at load."""
    if kind == "quick_gelu":
        return b.op("QuickGelu", [x], name, domain=CONTRIB_DOMAIN, alpha=QUICK_GELU_SCALE)
    if kind == "gelu":
        return gelu(b, x, name)
    return b.op("FastGelu", [x], name, domain=CONTRIB_DOMAIN)


def layer_norm(b: GraphBuilder, weights: HeadWeights, x: str, name: str, width: int, eps: float) -> str:
    """torch's LayerNorm `name` over the last axis of `x`."""
    scale = b.weight(f"{name}.weight", weights.get(f"{name}.weight", (width,)))
    bias = b.weight(f"{name}.bias", weights.get(f"{name}.bias", (width,)))
    return b.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=eps)


def projection(b: GraphBuilder, weights: HeadWeights, x: str, name: str, width_in: int, width_out: int) -> str:
    """torch's Linear `name` built without a bias (CLIP's text and visual projections)."""
    weight = weights.get(f"{name}.weight", (width_out, width_in))
    return b.op("MatMul", [x, b.weight(f"{name}.weight", weight.T)], name)


def mlp(b: GraphBuilder, weights: HeadWeights, tower: TowerConfig, x: str, name: str) -> str:
    """CLIPMLP / SiglipMLP `name`: fc1, the activation, fc2."""
    inner = linear(b, weights, x, f"{name}.fc1", tower.hidden_size, tower.intermediate_size)
    activated = activation(b, inner, tower.activation, f"{name}.act")
    return linear(b, weights, activated, f"{name}.fc2", tower.intermediate_size, tower.hidden_size)


def encoder_layers(  # noqa: PLR0913 - the tower, its tokens and how to shape and mask them
    b: GraphBuilder, weights: HeadWeights, tower: TowerConfig, tokens: str, heads_shape: str, mask_bias: str,
    prefix: str, sequence: int | None = None, key_mask: KeyMask | None = None, rows: PooledRows | None = None,
) -> str:  # fmt: skip
    """Every layer `{prefix}.layers.{i}` (CLIPEncoderLayer / SiglipEncoderLayer: x + attention(LN1 x), then
    x + MLP(LN2 x)) over `tokens` [B*S, H]. `heads_shape` is the int64 [4] shape [B, S, heads, head size] the
    queries, keys and values take; `mask_bias` ("" for none) is added to every head's scores [B, heads, S, S].
    Attention runs as onnxruntime's fused `Attention` where it can: unmasked over a fixed `sequence` (a vision tower's
    patches), or under a `key_mask` (a text tower's padding, causal or not) over any sequence; else as plain ops.
    With `rows` (the rows a pooled head reads; `heads_shape` given), the last layer is computed at those rows only
    (`layer_at_rows`) and the result is [B, H] (a tower has at least one layer: `clip._tower` checks it)."""
    width, eps = tower.hidden_size, tower.layer_norm_eps
    for index in range(tower.num_layers):
        name = f"{prefix}.layers.{index}"
        if rows is not None and index == tower.num_layers - 1:
            return layer_at_rows(b, weights, tower, tokens, rows, heads_shape, name)
        normed = layer_norm(b, weights, tokens, f"{name}.layer_norm1", width, eps)
        if key_mask is not None:
            attended = _fused_self_attention(b, weights, tower, normed, key_mask.rows_shape, f"{name}.self_attn",
                                             key_mask)  # fmt: skip
        elif sequence is not None and not mask_bias:
            attended = _fused_self_attention(b, weights, tower, normed, b.const([-1, sequence, width]),
                                             f"{name}.self_attn")  # fmt: skip
        else:
            attended = _self_attention(b, weights, tower, normed, heads_shape, mask_bias, f"{name}.self_attn")
        tokens = b.op("Add", [tokens, attended], f"{name}.attention_residual")
        normed = layer_norm(b, weights, tokens, f"{name}.layer_norm2", width, eps)
        tokens = b.op("Add", [tokens, mlp(b, weights, tower, normed, f"{name}.mlp")], f"{name}.output")
    return tokens


@attrs.frozen
class PooledRows:
    """The rows a pooled head reads: `index` int64 [B], one of the [B*S] tokens per item, and `bias` ("" for none)
    the float [B, 1, 1, S] added to their queries' scores over the keys (a masked key: -10000, as onnxruntime's
    fused `Attention` adds, whose softmax weight is 0 in float32)."""

    index: str
    bias: str = ""


# What a masked key adds to a score, as the fused `Attention` kernel's mask filter value.
MASKED_KEY_BIAS = -10000.0


def layer_at_rows(  # noqa: PLR0913 - one layer's inputs and names
    b: GraphBuilder, weights: HeadWeights, tower: TowerConfig, tokens: str, rows: PooledRows, heads_shape: str,
    name: str,
) -> str:  # fmt: skip
    """Layer `name` of `encoder_layers` for `rows` only: every token's keys and values, the rows' queries
    (1/√head_size folded in) under the rows' bias, attention, `out_proj`, the residual, LN2 and the MLP at the rows;
    out [B, H]. Rows do not interact past the keys and values, so each equals that row of the whole layer's output,
    for an eighth to a twelfth less of a pooled tower's work."""
    width, eps = tower.hidden_size, tower.layer_norm_eps
    attention = f"{name}.self_attn"
    normed = layer_norm(b, weights, tokens, f"{name}.layer_norm1", width, eps)
    kernel = np.concatenate([weights.get(f"{attention}.{part}.weight", (width, width)).T for part in PROJECTIONS[1:]],
                            axis=1)  # fmt: skip
    bias = np.concatenate([weights.get(f"{attention}.{part}.bias", (width,)) for part in PROJECTIONS[1:]])
    product = b.op("MatMul", [normed, b.weight(f"{attention}.kv.weight", kernel)], f"{attention}.kv_mm")
    key_value = b.op("Add", [product, b.weight(f"{attention}.kv.bias", bias)], f"{attention}.kv")
    key, value = b.op_multi("Split", [key_value, b.const([width] * 2)], [f"{attention}.k", f"{attention}.v"], axis=-1)
    key = _heads(b, key, heads_shape, [0, 2, 3, 1], f"{attention}.k_heads")  # [B, heads, d, S]
    value = _heads(b, value, heads_shape, [0, 2, 1, 3], f"{attention}.v_heads")  # [B, heads, S, d]
    scale = np.float32(tower.head_size**-0.5)
    query_kernel = weights.get(f"{attention}.q_proj.weight", (width, width)).T * scale
    query_bias = weights.get(f"{attention}.q_proj.bias", (width,)) * scale
    query_rows = b.op("Gather", [normed, rows.index], f"{attention}.query_rows", axis=0)  # [B, H]
    query = b.op("MatMul", [query_rows, b.weight(f"{attention}.q.weight", query_kernel)], f"{attention}.q_mm")
    query = b.op("Add", [query, b.weight(f"{attention}.q.bias", query_bias)], f"{attention}.q")
    query_shape = b.const([-1, 1, tower.num_heads, tower.head_size])
    query = _heads(b, query, query_shape, [0, 2, 1, 3], f"{attention}.q_heads")  # [B, heads, 1, d]
    attended = _attend(b, weights, width, query, key, value, rows.bias, attention)  # [B, H]
    state = b.op("Add", [b.op("Gather", [tokens, rows.index], f"{name}.rows", axis=0), attended],
                 f"{name}.attention_residual")  # fmt: skip
    normed = layer_norm(b, weights, state, f"{name}.layer_norm2", width, eps)
    return b.op("Add", [state, mlp(b, weights, tower, normed, f"{name}.mlp")], f"{name}.output")


@attrs.frozen
class KeyMask:
    """Which keys each text's queries may read, as the fused `Attention` takes it: `mask` the int32 [B, S] padding
    mask (1: a real token), `causal` whether a query also reads no later key, `rows_shape` the int64 [3] shape
    [B, S, H] the tokens take for the kernel."""

    mask: str
    rows_shape: str
    causal: bool = False


def _self_attention(  # noqa: PLR0913 - one attention block's inputs and names
    b: GraphBuilder, weights: HeadWeights, tower: TowerConfig, x: str, heads_shape: str, mask_bias: str, name: str
) -> str:
    """CLIPAttention / SiglipAttention `name` on [B*S, H] tokens: Q, K and V in one product (the 1/√head_size scale
    folded into Q), softmax over the keys, the heads merged and `out_proj`."""
    width = tower.hidden_size
    scale = np.float32(tower.head_size**-0.5)
    kernels, biases = [], []
    for part, factor in (("q_proj", scale), ("k_proj", 1), ("v_proj", 1)):
        kernels.append(weights.get(f"{name}.{part}.weight", (width, width)).T * factor)
        biases.append(weights.get(f"{name}.{part}.bias", (width,)) * factor)
    product = b.op("MatMul", [x, b.weight(f"{name}.qkv.weight", np.concatenate(kernels, axis=1))], f"{name}.qkv_mm")
    qkv = b.op("Add", [product, b.weight(f"{name}.qkv.bias", np.concatenate(biases))], f"{name}.qkv")
    query, key, value = b.op_multi("Split", [qkv, b.const([width] * 3)],
                                   [f"{name}.q", f"{name}.k", f"{name}.v"], axis=-1)  # fmt: skip
    query = _heads(b, query, heads_shape, [0, 2, 1, 3], f"{name}.q_heads")  # [B, heads, S, d]
    key = _heads(b, key, heads_shape, [0, 2, 3, 1], f"{name}.k_heads")  # [B, heads, d, S]
    value = _heads(b, value, heads_shape, [0, 2, 1, 3], f"{name}.v_heads")  # [B, heads, S, d]
    return _attend(b, weights, width, query, key, value, mask_bias, name)


def _fused_self_attention(  # noqa: PLR0913 - one attention block's inputs and names
    b: GraphBuilder, weights: HeadWeights, tower: TowerConfig, x: str, rows_shape: str, name: str,
    key_mask: KeyMask | None = None,
) -> str:  # fmt: skip
    """`_self_attention` as one `Attention` kernel (Q, K and V in one product, 1/√head_size, softmax and the context)
    on the tokens shaped `rows_shape` [B, S, H], under `key_mask` when given, then `out_proj`. A masked key scores
    onnxruntime's mask filter value (-10000), whose softmax weight is 0 in float32, as the plain path's bias gives."""
    width = tower.hidden_size
    kernel = np.concatenate([weights.get(f"{name}.{part}.weight", (width, width)).T for part in PROJECTIONS], axis=1)
    bias = np.concatenate([weights.get(f"{name}.{part}.bias", (width,)) for part in PROJECTIONS])
    tokens = b.op("Reshape", [x, rows_shape], f"{name}.tokens_3d")
    inputs = [tokens, b.weight(f"{name}.qkv.weight", kernel), b.weight(f"{name}.qkv.bias", bias)]
    attributes: dict[str, int] = {"num_heads": tower.num_heads}
    if key_mask is not None:
        inputs.append(key_mask.mask)
        attributes["unidirectional"] = int(key_mask.causal)
    context = b.op("Attention", inputs, f"{name}.fused", domain=CONTRIB_DOMAIN, **attributes)
    merged = b.op("Reshape", [context, b.const([-1, width])], f"{name}.merged")
    return linear(b, weights, merged, f"{name}.out_proj", width, width)


PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def _heads(b: GraphBuilder, x: str, heads_shape: str, perm: list[int], name: str) -> str:
    """[B*S, H] split into heads [B, S, heads, d] and transposed by `perm`."""
    return b.op("Transpose", [b.op("Reshape", [x, heads_shape], f"{name}.split")], name, perm=perm)


def _attend(  # noqa: PLR0913 - one attention's tensors
    b: GraphBuilder, weights: HeadWeights, width: int, query: str, key: str, value: str, mask_bias: str, name: str
) -> str:
    """softmax(query · key + mask_bias) · value, the heads merged back into rows [B*Q, H], then `{name}.out_proj`."""
    scores = b.op("MatMul", [query, key], f"{name}.scores")
    if mask_bias:
        scores = b.op("Add", [scores, mask_bias], f"{name}.masked_scores")
    probabilities = b.op("Softmax", [scores], f"{name}.probabilities", axis=-1)
    context = b.op("MatMul", [probabilities, value], f"{name}.context")  # [B, heads, Q, d]
    context = b.op("Transpose", [context], f"{name}.context_rows", perm=[0, 2, 1, 3])
    context = b.op("Reshape", [context, b.const([-1, width])], f"{name}.merged")
    return linear(b, weights, context, f"{name}.out_proj", width, width)


def patch_embeddings(  # noqa: PLR0913 - the Conv's shape
    b: GraphBuilder, weights: HeadWeights, pixels: str, name: str, channels: int, width: int, patch: int, bias: bool
) -> str:
    """The strided Conv `name` (kernel and stride `patch`; CLIP's without a bias, SigLIP's with one) over `pixels`
    [B, C, height, width], flattened row by row into patch tokens [B, patches, width]."""
    inputs = [pixels, b.weight(f"{name}.weight", weights.get(f"{name}.weight", (width, channels, patch, patch)))]
    if bias:
        inputs.append(b.weight(f"{name}.bias", weights.get(f"{name}.bias", (width,))))
    grid = b.op("Conv", inputs, name, kernel_shape=[patch, patch], strides=[patch, patch])  # [B, width, rows, cols]
    flat = b.op("Reshape", [grid, b.const([0, width, -1])], f"{name}.flat")
    return b.op("Transpose", [flat], f"{name}.tokens", perm=[0, 2, 1])


def attention_pooling(b: GraphBuilder, weights: HeadWeights, tower: TowerConfig, tokens: str, sequence: int,
                      name: str) -> str:  # fmt: skip
    """SiglipMultiheadAttentionPoolingHead `name` over `tokens` [B*sequence, H]: the probe's query (a constant, as
    the probe is a parameter) attends over every token through `nn.MultiheadAttention` (`in_proj_*` stacking Q, K
    and V, `out_proj`), then x + MLP(LayerNorm x); out [B, H]."""
    width, heads, size = tower.hidden_size, tower.num_heads, tower.head_size
    attention = f"{name}.attention"
    kernel = weights.get(f"{attention}.in_proj_weight", (3 * width, width))
    bias = weights.get(f"{attention}.in_proj_bias", (3 * width,))
    probe = weights.get(f"{name}.probe", (1, 1, width)).reshape(1, width)
    query = (probe @ kernel[:width].T + bias[:width]) * np.float32(size**-0.5)
    query = b.weight(f"{attention}.query", query.reshape(1, 1, heads, size).transpose(0, 2, 1, 3))  # [1, heads, 1, d]
    product = b.op("MatMul", [tokens, b.weight(f"{attention}.kv.weight", kernel[width:].T)], f"{attention}.kv_mm")
    key_value = b.op("Add", [product, b.weight(f"{attention}.kv.bias", bias[width:])], f"{attention}.kv")
    key, value = b.op_multi("Split", [key_value, b.const([width] * 2)], [f"{attention}.k", f"{attention}.v"], axis=-1)
    heads_shape = b.const([-1, sequence, heads, size])
    key = _heads(b, key, heads_shape, [0, 2, 3, 1], f"{attention}.k_heads")
    value = _heads(b, value, heads_shape, [0, 2, 1, 3], f"{attention}.v_heads")
    pooled = _attend(b, weights, width, query, key, value, "", attention)  # [B, H]: one query per image
    normed = layer_norm(b, weights, pooled, f"{name}.layernorm", width, tower.layer_norm_eps)
    return b.op("Add", [pooled, mlp(b, weights, tower, normed, f"{name}.mlp")], f"{name}.output")
