"""NV-Embed's latent-attention block (nvidia/NV-Embed-v2, config `model_type: nvembed`), config + graph. The model is a
Mistral attending both ways (its `text_config`, weights under `embedding_model.`) whose hidden states then go, token
by token, through one cross-attention to learned latents (queries from the LayerNorm-ed token, keys and values from
the LayerNorm-ed latents, no mask: every token sees every latent) and a GEGLU feed-forward (LayerNorm, a linear to
2 × 4 × width, half of it times the GELU of the other half, a linear back), each with its residual. The adapter means
the result over the text's tokens (the instruction's left out, as the config's `is_mask_instruction` says) and
normalizes it.

Read from the checkpoint's remote code (`modeling_nvembed.py`: `LatentAttentionModel`, `PreNorm`, `Attention`,
`FeedForward`, `GEGLU`; `configuration_nvembed.py` for the defaults) and checked against a transcription of it in torch
on random checkpoints (tests/integration/test_nvembed.py).

The latents are weights, so their keys and values are constants, folded at conversion: each head's query projection
into its keys (scores = LN(x) · W_q,h^T K_h^T / sqrt(head_dim)) and its values into the output projection
(V_h · W_out,h^T). A token then costs two products of width heads × latents instead of four of width heads × head_dim
(NV-Embed-v2: 8 × 512 against 8 × 4096).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.decoder_graph import Precision
from sie.worker.convert.encoder_graph import gelu
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.graph_builder import GraphBuilder
from sie.worker.convert.head_layers import HeadWeights
from sie.worker.convert.safetensors_io import Checkpoint

# Where an NV-Embed checkpoint keeps its decoder's and its latent block's tensors.
DECODER_PREFIX: Final = "embedding_model."
LATENT_PREFIX: Final = "latent_attention_model."
# torch.nn.LayerNorm's default, which the block's norms keep.
LAYER_NORM_EPS: Final = 1e-5
FEED_FORWARD_MULTIPLIER: Final = 4
# LatentAttentionConfig's defaults (configuration_nvembed.py), for a config that leaves a key out.
DEFAULTS: Final = {"num_latents_value": 512, "num_cross_heads": 8, "hidden_dim": 4096, "latent_dim": 4096,
                   "cross_dim_head": 4096, "output_normalize": True}  # fmt: skip


@attrs.frozen
class LatentAttentionConfig:
    """The latent-attention block of one NV-Embed checkpoint."""

    latents: int
    heads: int
    head_dim: int
    width: int  # the decoder's hidden size, which the block keeps

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim


def decoder_config_of(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The decoder of an NV-Embed config as the Mistral it is, attending both ways and without its sliding window:
    the remote code masks padding only (`_prepare_4d_attention_mask`), whatever the text config's window says."""
    text = raw.get("text_config")
    if not isinstance(text, Mapping):
        raise ConversionError("an nvembed config needs a text_config (its decoder)", source=source)
    if text.get("model_type", "bidir_mistral") not in ("bidir_mistral", "mistral"):
        raise ConversionError(f"text_config.model_type {text.get('model_type')!r} is not bidir_mistral",
                              source=source)  # fmt: skip
    return {**text, "model_type": "mistral", "is_causal": False, "sliding_window": None}


def parse_latent_attention_config(raw: Mapping[str, Any], width: int, source: str) -> LatentAttentionConfig:
    """The `latent_attention_config` of an NV-Embed config; its widths must be the decoder's (`width`), as the
    remote code's norms need."""
    latent = {**DEFAULTS, **(raw.get("latent_attention_config") or {})}
    numbers = {}
    for key in ("num_latents_value", "num_cross_heads", "cross_dim_head", "hidden_dim", "latent_dim"):
        value = latent[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConversionError(f"latent_attention_config.{key} must be a positive integer, got {value!r}",
                                  source=source)  # fmt: skip
        numbers[key] = value
    if numbers["hidden_dim"] != width or numbers["latent_dim"] != width:
        raise ConversionError(
            f"latent_attention_config hidden_dim {numbers['hidden_dim']} and latent_dim {numbers['latent_dim']} must "
            f"both be the decoder's hidden size {width}",
            source=source,
        )
    if not latent["output_normalize"]:
        raise ConversionError("latent_attention_config.output_normalize false is not built", source=source)
    return LatentAttentionConfig(numbers["num_latents_value"], numbers["num_cross_heads"], numbers["cross_dim_head"],
                                 width)  # fmt: skip


def build_latent_attention(  # noqa: PLR0913 - the block's parts
    builder: GraphBuilder,
    config: LatentAttentionConfig,
    checkpoint: Checkpoint,
    precision: Precision,
    hidden: str,
    output: str,
) -> str:
    """The block over `hidden` (float32 [B, S, width]) into the float32 [B, S, width] tensor `output`; returns its
    name."""
    return _LatentBlock(builder, config, checkpoint, precision).build(hidden, output)


class _LatentBlock:
    """Emits the block into a GraphBuilder; the checkpoint's tensors are read (shapes checked) as nodes are added."""

    def __init__(
        self, builder: GraphBuilder, config: LatentAttentionConfig, checkpoint: Checkpoint, precision: Precision
    ) -> None:
        self.b = builder
        self.config = config
        self.weights = HeadWeights(checkpoint, LATENT_PREFIX)
        self.precision = precision

    def build(self, hidden: str, output: str) -> str:
        b, width = self.b, self.config.width
        shape = b.op("Shape", [hidden], "latent.shape")
        x = b.op("Reshape", [hidden, b.const([-1, width])], "latent.rows")
        x = b.op("Add", [self._cross_attention(x), x], "latent.attended")
        x = b.op("Add", [self._feed_forward(x), x], "latent.fed_forward")
        return b.op("Reshape", [x, shape], output)

    def _norm(self, x: str, name: str) -> str:
        width = self.config.width
        scale = self.b.weight(f"{name}.weight", self.weights.get(f"{name}.weight", (width,)))
        bias = self.b.weight(f"{name}.bias", self.weights.get(f"{name}.bias", (width,)))
        return self.b.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=LAYER_NORM_EPS)

    def _product(self, x: str, matrix: np.ndarray, name: str, bias: np.ndarray | None = None) -> str:
        """x (float32 rows) times a constant `matrix` [in, out] (+ `bias`) in the graph's precision, back to
        float32."""
        b, half = self.b, self.precision.onnx != TensorProto.FLOAT
        operand = b.op("Cast", [x], f"{name}.cast", to=self.precision.onnx) if half else x
        inputs = [operand, b.weight(f"{name}.weight", matrix, self.precision.numpy)]
        if bias is not None:
            inputs.append(b.weight(f"{name}.bias", bias, self.precision.numpy))
        product = b.op("Gemm", inputs, name)
        return b.op("Cast", [product], f"{name}.float", to=TensorProto.FLOAT) if half else product

    def _cross_attention(self, x: str) -> str:
        """Every token's queries against the latents' keys, over their values and out: [N, width]."""
        b, cfg = self.b, self.config
        block = "cross_attend_blocks.0"
        latents = self.weights.get("latents", (cfg.latents, cfg.width)).astype(np.float64)
        context = _layer_norm(latents, self.weights.get(f"{block}.norm_context.weight", (cfg.width,)),
                              self.weights.get(f"{block}.norm_context.bias", (cfg.width,)))  # fmt: skip
        to_kv = self.weights.get(f"{block}.fn.to_kv.weight", (2 * cfg.inner, cfg.width))
        to_q = self.weights.get(f"{block}.fn.to_q.weight", (cfg.inner, cfg.width))
        to_out = self.weights.get(f"{block}.fn.to_out.weight", (cfg.width, cfg.inner))
        scale = 1.0 / math.sqrt(cfg.head_dim)
        # Each head folded in float64, a slice at a time: [width, latents], its query projection times its keys
        # (scaled); [latents, width], its values times its slice of the output projection.
        scores_of, out_of = [], []
        for head in range(cfg.heads):
            rows = slice(head * cfg.head_dim, (head + 1) * cfg.head_dim)
            keys = context @ to_kv[rows].T.astype(np.float64)  # [latents, head_dim]
            values = context @ to_kv[cfg.inner :][rows].T.astype(np.float64)
            scores_of.append(to_q[rows].T.astype(np.float64) @ keys.T * scale)
            out_of.append(values @ to_out[:, rows].T.astype(np.float64))
        normed = self._norm(x, f"{block}.norm")
        scores = b.op("Reshape", [self._product(normed, np.concatenate(scores_of, axis=1), f"{block}.scores"),
                                  b.const([-1, cfg.heads, cfg.latents])], f"{block}.scores_per_head")  # fmt: skip
        probabilities = b.op("Softmax", [scores], f"{block}.probabilities", axis=-1)
        rows = b.op("Reshape", [probabilities, b.const([-1, cfg.heads * cfg.latents])], f"{block}.probability_rows")
        return self._product(rows, np.concatenate(out_of, axis=0), f"{block}.out")

    def _feed_forward(self, x: str) -> str:
        """GEGLU: the first half of the widened token times the GELU of the second, back to the width."""
        b, width = self.b, self.config.width
        block, inner = "cross_attend_blocks.1", width * FEED_FORWARD_MULTIPLIER
        widen = self.weights.get(f"{block}.fn.net.0.weight", (2 * inner, width))
        narrow = self.weights.get(f"{block}.fn.net.2.weight", (width, inner))
        widened = self._product(self._norm(x, f"{block}.norm"), widen.T,
                                f"{block}.widen", self.weights.get(f"{block}.fn.net.0.bias", (2 * inner,)))  # fmt: skip
        value = b.op("Slice", [widened, b.const([0]), b.const([inner]), b.const([1])], f"{block}.value")
        gate = b.op("Slice", [widened, b.const([inner]), b.const([2 * inner]), b.const([1])], f"{block}.gate")
        gated = b.op("Mul", [value, gelu(b, gate, f"{block}.gelu")], f"{block}.gated")
        return self._product(gated, narrow.T, f"{block}.narrow", self.weights.get(f"{block}.fn.net.2.bias", (width,)))


def _layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + LAYER_NORM_EPS) * scale + bias
