"""Output heads added on top of the encoder: pooled sentence embeddings, classifiers and SPLADE.

`HEADS` maps each head name to the outputs it declares and the function that builds it; every head reads its own
weights through `EncoderWeights`, under the names the checkpoint's family uses (`families.py`: BERT's pooler and
`classifier`, RoBERTa's and ELECTRA's `classifier.dense`/`out_proj`, DistilBERT's `pre_classifier`; the MLM heads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.bart import BartConfig, last_eos_rows
from sie.worker.convert.deberta import DebertaConfig
from sie.worker.convert.encoder_graph import (
    BATCH,
    SEQUENCE,
    EncoderOutput,
    EncoderWeights,
    gelu,
    layer_norm,
    linear,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import EncoderConfig, MlmHead
from sie.worker.convert.graph_builder import GraphBuilder, tensor_info
from sie.worker.convert.modernbert import ModernBertConfig
from sie.worker.convert.names import SEQ_CLS_WITH_STATES
from sie.worker.convert.rotary_glu import RotaryGluConfig

# sentence-transformers clamps the token count at 1e-9 and F.normalize clamps the norm at 1e-12.
MIN_TOKEN_COUNT = 1e-9
MIN_NORM = 1e-12
_FLOAT = TensorProto.FLOAT


# The configs of the backbones a head is built on.
HeadConfig = EncoderConfig | ModernBertConfig | RotaryGluConfig | DebertaConfig | BartConfig


@attrs.frozen
class HeadContext:
    """Everything a head builder needs: the graph so far, the checkpoint and the encoder's tensors."""

    builder: GraphBuilder
    config: HeadConfig
    weights: EncoderWeights
    encoder: EncoderOutput


HeadBuild = Callable[[HeadContext], list[onnx.ValueInfoProto]]


@attrs.frozen
class Head:
    """One conversion target: its graph outputs, in order, and its builder."""

    name: str
    outputs: tuple[str, ...]
    build: HeadBuild = attrs.field(repr=False)


def _hidden_output(ctx: HeadContext) -> onnx.ValueInfoProto:
    return tensor_info(ctx.encoder.hidden, _FLOAT, [BATCH, SEQUENCE, ctx.config.hidden_size])


def _l2_normalize(builder: GraphBuilder, x: str, output: str) -> str:
    norm = builder.op("ReduceL2", [x], f"{output}.norm", axes=[1], keepdims=1)
    norm = builder.op("Max", [norm, builder.const(MIN_NORM, np.float32)], f"{output}.norm_clamped")
    return builder.op("Div", [x, norm], output)


def _build_none(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    return [_hidden_output(ctx)]


def _build_mean(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    """Attention-mask mean pool, then L2 normalisation (sentence-transformers Pooling + Normalize)."""
    b, mask = ctx.builder, ctx.encoder.mask
    # A [B,1,S] x [B,S,H] MatMul sums the real tokens in one op, without a [B,S,H] masked copy.
    row_mask = b.op("Unsqueeze", [mask, b.const([1])], "pool.row_mask")
    summed = b.op("MatMul", [row_mask, ctx.encoder.hidden], "pool.sum3d")
    summed = b.op("Squeeze", [summed, b.const([1])], "pool.sum")
    count = b.op("ReduceSum", [mask, b.const([1])], "pool.count", keepdims=1)
    count = b.op("Max", [count, b.const(MIN_TOKEN_COUNT, np.float32)], "pool.count_clamped")
    mean = b.op("Div", [summed, count], "pool.mean")
    _l2_normalize(b, mean, "sentence_embedding")
    return [_hidden_output(ctx), tensor_info("sentence_embedding", _FLOAT, [BATCH, ctx.config.hidden_size])]


def _build_cls(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    """The first token's hidden state ([CLS]), L2-normalised."""
    b = ctx.builder
    first = b.op("Gather", [ctx.encoder.hidden, b.const(0)], "pool.cls", axis=1)
    _l2_normalize(b, first, "sentence_embedding")
    return [_hidden_output(ctx), tensor_info("sentence_embedding", _FLOAT, [BATCH, ctx.config.hidden_size])]


def _num_labels(ctx: HeadContext, classifier: str = "classifier") -> int:
    """Label count from `id2label`, or from the rows of the last classifier layer when the config has none."""
    if ctx.config.labels:
        return len(ctx.config.labels)
    name = f"{classifier}.weight"
    entry = ctx.weights.tensors.entries.get(name)
    if entry is None or len(entry.shape) != 2:
        raise ConversionError("required 2-D classifier weight is missing", source=ctx.weights.source, tensor=name)
    return entry.shape[0]


def reads_first_token_only(head: str, config: HeadConfig) -> bool:
    """Whether `head` reads the backbone's first token alone, so its last layer need only be computed there: the
    sequence classifier, except BART's (the decoder's last <eos>) and a mean-pooling ModernBERT's (every token)."""
    if head != "seq-cls" or isinstance(config, BartConfig):
        return False
    return not isinstance(config, ModernBertConfig) or config.classifier_pooling == "cls"


def _build_seq_cls(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    """The family's sequence classifier on the first token (BART's on the decoder's last <eos>): one logit row per
    sequence."""
    b, width, kind = ctx.builder, ctx.config.hidden_size, ctx.config.family.sequence_classifier
    if isinstance(ctx.config, BartConfig):  # the decoder's state at the last <eos>, `classification_head`
        labels = _num_labels(ctx, "classification_head.out_proj")
        pooled = last_eos_rows(b, ctx.config, ctx.encoder.hidden)
        dense = ctx.weights.linear("classification_head.dense", width, width)
        inner = b.op("Tanh", [linear(b, pooled, dense, "classification_head.dense")], "classification_head.tanh")
        out_proj = ctx.weights.linear("classification_head.out_proj", width, labels)
        linear(b, inner, out_proj, "classification_head.out_proj", output="logits")
        return [tensor_info("logits", _FLOAT, [BATCH, labels])]
    first = b.op("Gather", [ctx.encoder.hidden, b.const(0)], "classifier.first", axis=1)
    if kind == "pooler":  # BERT: the pooler (dense + tanh), then `classifier`
        labels = _num_labels(ctx)
        pooled = linear(b, first, ctx.weights.base_linear("pooler.dense", width, width), "pooler.dense")
        pooled = b.op("Tanh", [pooled], "pooler.tanh")
        linear(b, pooled, ctx.weights.linear("classifier", width, labels), "classifier", output="logits")
    elif kind == "deberta":  # DeBERTa: the context pooler (`pooler.dense`, GELU), then `classifier`
        labels = _num_labels(ctx)
        pooled = gelu(
            b, linear(b, first, ctx.weights.linear("pooler.dense", width, width), "pooler.dense"), "pooler.gelu"
        )
        linear(b, pooled, ctx.weights.linear("classifier", width, labels), "classifier", output="logits")
    elif kind == "relu":  # DistilBERT: `pre_classifier`, relu, `classifier`
        labels = _num_labels(ctx)
        inner = linear(b, first, ctx.weights.linear("pre_classifier", width, width), "pre_classifier")
        inner = b.op("Relu", [inner], "pre_classifier.relu")
        linear(b, inner, ctx.weights.linear("classifier", width, labels), "classifier", output="logits")
    elif kind == "modernbert":  # ModernBERT: cls or mean pooling, its prediction head, then `classifier`
        labels = _num_labels(ctx)
        pooled = first if ctx.config.classifier_pooling == "cls" else _masked_mean(ctx, "classifier.mean")
        pooled = _prediction_head(ctx, pooled)
        linear(b, pooled, ctx.weights.linear("classifier", width, labels), "classifier", output="logits")
    else:  # RoBERTa (tanh), ELECTRA (gelu): `classifier.dense`, the activation, `classifier.out_proj`
        labels = _num_labels(ctx, "classifier.out_proj")
        inner = linear(b, first, ctx.weights.linear("classifier.dense", width, width), "classifier.dense")
        inner = b.op("Tanh", [inner], "classifier.tanh") if kind == "tanh" else gelu(b, inner, "classifier.gelu")
        out_proj = ctx.weights.linear("classifier.out_proj", width, labels)
        linear(b, inner, out_proj, "classifier.out_proj", output="logits")
    return [tensor_info("logits", _FLOAT, [BATCH, labels])]


def _masked_mean(ctx: HeadContext, name: str) -> str:
    """The mean of the real tokens' hidden states, [B, H] (no normalisation)."""
    b, mask = ctx.builder, ctx.encoder.mask
    row_mask = b.op("Unsqueeze", [mask, b.const([1])], f"{name}.row_mask")
    summed = b.op(
        "Squeeze", [b.op("MatMul", [row_mask, ctx.encoder.hidden], f"{name}.sum3d"), b.const([1])], f"{name}.sum"
    )
    count = b.op("ReduceSum", [mask, b.const([1])], f"{name}.count", keepdims=1)
    count = b.op("Max", [count, b.const(MIN_TOKEN_COUNT, np.float32)], f"{name}.count_clamped")
    return b.op("Div", [summed, count], name)


def _prediction_head(ctx: HeadContext, x: str) -> str:
    """ModernBERT's `head` before its classifiers: dense, GELU, LayerNorm (biases as the config says)."""
    b, cfg = ctx.builder, ctx.config
    x = linear(
        b, x, ctx.weights.linear("head.dense", cfg.hidden_size, cfg.hidden_size, cfg.classifier_bias), "head.dense"
    )
    params = ctx.weights.layer_norm("head.norm", cfg.hidden_size, cfg.norm_bias)
    return layer_norm(b, gelu(b, x, "head.gelu"), params, "head.norm", cfg.layer_norm_eps)


def _build_token_cls(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    """The classifier on every token (after ModernBERT's prediction head): one logit row per position."""
    b, width, labels = ctx.builder, ctx.config.hidden_size, _num_labels(ctx)
    tokens = ctx.encoder.hidden
    if ctx.config.family.sequence_classifier == "modernbert":
        tokens = _prediction_head(ctx, tokens)
    linear(b, tokens, ctx.weights.linear("classifier", width, labels), "classifier", output="logits")
    return [tensor_info("logits", _FLOAT, [BATCH, SEQUENCE, labels])]


def _mlm_head(ctx: HeadContext) -> MlmHead:
    head = ctx.config.family.mlm
    if head is None:
        raise ConversionError(
            f"the {ctx.config.family.name} family has no masked-language-model head to build SPLADE on",
            source=ctx.weights.source,
        )
    return head


def _decoder_table(ctx: HeadContext, head: MlmHead) -> str:
    """The MLM decoder matrix: the shared word-embedding initializer unless the checkpoint unties it."""
    shape = (ctx.config.vocab_size, ctx.config.hidden_size)
    if not ctx.weights.has(head.decoder):
        return ctx.encoder.word_embeddings
    decoder = ctx.weights.get(head.decoder, shape)
    if np.array_equal(decoder, ctx.weights.base(head.word_embeddings, shape)):
        return ctx.encoder.word_embeddings
    return ctx.builder.weight(head.decoder, decoder)


def _decoder_bias(ctx: HeadContext, head: MlmHead) -> np.ndarray:
    if not ctx.config.decoder_bias:  # ModernBERT's decoder_bias: false
        return np.zeros(ctx.config.vocab_size, dtype=np.float32)
    for name in head.biases:
        if ctx.weights.has(name):
            return ctx.weights.get(name, (ctx.config.vocab_size,))
    raise ConversionError("required MLM bias is missing", source=ctx.weights.source, tensor=head.biases[0])


def _mlm_logits(ctx: HeadContext) -> str:
    """The family's masked-LM prediction head as [B*S, V] logits (dense, GELU, LayerNorm, tied decoder)."""
    b, cfg, head = ctx.builder, ctx.config, _mlm_head(ctx)
    width = cfg.hidden_size
    x = linear(b, ctx.encoder.tokens, ctx.weights.linear(head.dense, width, width, cfg.classifier_bias), head.dense)
    x = gelu(b, x, f"{head.dense}.gelu")
    x = layer_norm(b, x, ctx.weights.layer_norm(head.norm, width, cfg.norm_bias), head.norm, cfg.layer_norm_eps)
    bias = b.weight("mlm.bias", _decoder_bias(ctx, head))
    # Gemm with transB reads the [V, H] embedding table as stored, so the tie costs no second copy.
    return b.op("Gemm", [x, _decoder_table(ctx, head), bias], "mlm.logits", transB=1)


def _mlm_logits3d(ctx: HeadContext) -> str:
    """The MLM logits as `[B, S, V]`."""
    b = ctx.builder
    batch_sequence = b.op("Shape", ["input_ids"], "mlm.batch_sequence")
    shape = b.op("Concat", [batch_sequence, b.const([ctx.config.vocab_size])], "mlm.shape", axis=0)
    return b.op("Reshape", [_mlm_logits(ctx), shape], "mlm.logits3d")


def _splade_sum(double_log: bool) -> HeadBuild:
    """SPLADE pooled by sum (sentence-transformers `SpladePooling("sum")`): the sum over real positions of
    log(1 + relu(MLM logits)), with `double_log` its `log1p_relu` activation, log(1 + log(1 + relu(x))), taken
    per token before the sum."""

    def build(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
        b = ctx.builder
        positive = b.op("Relu", [_mlm_logits3d(ctx)], "splade.relu")
        weights = b.op("Log", [b.op("Add", [positive, b.const(1.0, np.float32)], "splade.plus1")], "splade.log1p")
        if double_log:
            weights = b.op("Log", [b.op("Add", [weights, b.const(1.0, np.float32)], "splade.plus1_again")],
                           "splade.log1p_again")  # fmt: skip
        # A [B,1,S] x [B,S,V] MatMul sums the real positions in one op, padding weighted 0.
        row_mask = b.op("Unsqueeze", [ctx.encoder.mask, b.const([1])], "splade.row_mask")
        summed = b.op("MatMul", [row_mask, weights], "splade.sum3d")
        b.op("Squeeze", [summed, b.const([1])], "sparse_embedding")
        return [tensor_info("sparse_embedding", _FLOAT, [BATCH, ctx.config.vocab_size])]

    return build


def _build_mlm_splade(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    """SPLADE: max over real positions of log(1 + relu(MLM logits)), one vocab-wide row per sequence."""
    b = ctx.builder
    logits = _mlm_logits3d(ctx)
    # log(1 + relu(x)) never decreases as x grows, so it commutes with the max: take the max of the
    # raw logits first (padding pushed to MASK_NEGATIVE) and apply it to [B, V] instead of [B, S, V].
    position_bias = b.op("Unsqueeze", [ctx.encoder.padding_bias, b.const([2])], "splade.position_bias")
    logits = b.op("Add", [logits, position_bias], "splade.masked_logits")
    peak = b.op("ReduceMax", [logits], "splade.max_logits", axes=[1], keepdims=0)
    positive = b.op("Relu", [peak], "splade.relu")
    shifted = b.op("Add", [positive, b.const(1.0, np.float32)], "splade.plus1")
    b.op("Log", [shifted], "sparse_embedding")
    return [tensor_info("sparse_embedding", _FLOAT, [BATCH, ctx.config.vocab_size])]


def _build_seq_cls_with_states(ctx: HeadContext) -> list[onnx.ValueInfoProto]:
    """The sequence classifier's logits and every token's last hidden state beside them, for a head trained apart
    that reads the states (a context pruner's token head, on the host)."""
    return [_hidden_output(ctx), *_build_seq_cls(ctx)]


HEADS: Mapping[str, Head] = MappingProxyType(
    {
        head.name: head
        for head in (
            Head("none", ("last_hidden_state",), _build_none),
            Head("mean", ("last_hidden_state", "sentence_embedding"), _build_mean),
            Head("cls", ("last_hidden_state", "sentence_embedding"), _build_cls),
            Head("seq-cls", ("logits",), _build_seq_cls),
            Head(SEQ_CLS_WITH_STATES, ("last_hidden_state", "logits"), _build_seq_cls_with_states),
            Head("token-cls", ("logits",), _build_token_cls),
            Head("mlm-splade", ("sparse_embedding",), _build_mlm_splade),
            Head("mlm-splade-sum", ("sparse_embedding",), _splade_sum(double_log=False)),
            Head("mlm-splade-sum-log1p", ("sparse_embedding",), _splade_sum(double_log=True)),
        )
    }
)
