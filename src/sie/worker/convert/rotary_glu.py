"""The post-LayerNorm rotary encoders with a gated feed-forward, config + graph, as data per family:

- GTE "new" (`model_type: new`, remote code `Alibaba-NLP/new-impl`: gte-*-v1.5, gte-multilingual, stella_en_400M_v5;
  snowflake-arctic-embed-m-v2.0 names the same code `model_type: gte`, architecture `GteModel`): word (+ token type)
  embeddings and `embeddings.LayerNorm`; rotary positions (`rope_theta`, optional fixed NTK `rope_scaling`); layers
  `encoder.layer.{i}` with a fused Q/K/V projection `attention.qkv_proj` (with bias), `attention.o_proj`, `attn_ln`,
  and `mlp.up_gate_proj` (no bias: its first half `up`, its second the `gate` that goes through GELU) into
  `mlp.down_proj`, `mlp_ln`. Its task heads are BERT's names under `new.`: the pooler (dense + tanh) and `classifier`,
  and the MLM head `lm_head` (dense, GELU, `norm`, `decoder`). Read from `modeling.py`/`configuration.py` of
  `Alibaba-NLP/new-impl` (NewEmbeddings, NTKScalingRotaryEmbedding, NewAttention, NewGatedMLP, NewLayer) and checked
  against text-embeddings-inference's `gte.rs`.
- NomicBERT (`model_type: nomic_bert`, remote code `nomic-ai/nomic-bert-2048`: nomic-embed-text-v1/v1.5): GPT-2
  style config names (`n_embd`, `n_head`, ...); `emb_ln` after word (+ token type) embeddings; rotary positions
  (`rotary_emb_base`, the whole head, not interleaved); layers `encoder.layers.{i}` with `attn.Wqkv` and
  `attn.out_proj` (biases when `qkv_proj_bias`), `norm1`, and a SwiGLU feed-forward `fc2(fc11(x) * silu(fc12(x)))`
  (biases as `mlp_fc1_bias`/`mlp_fc2_bias`), `norm2`. Read from `modeling_hf_nomic_bert.py` (NomicBertEmbeddings,
  NomicBertAttention, NomciBertGatedMLP, NomicBertBlock with `prenorm: false`). nomic-embed-text-v2-moe's config
  (`activation_function: gelu`) has a plain feed-forward `fc2(gelu(fc1(x)))` instead, and on every layer `i` with
  `i % moe_every_n_layers == 1` a mixture of experts in megablocks' layout (contrastors' `layers/block.py` builds it
  with megablocks' dMoE): the router `mlp.router.layer` (no bias) gives each token a softmax over the experts, the
  `moe_top_k` largest weights (not renormalised) pick its experts, expert `e` computes
  `gelu(x @ w1[e].T) @ w2[e]` (`mlp.experts.mlp.w1` and `w2`, each [experts × inner, hidden]), and the weighted
  sum plus `mlp.experts.bias` is the layer's feed-forward. In the graph each expert runs on the tokens routed to it
  only (gathered, then scattered back with their weights), so the work is the top-k's, not every expert's.

Both: no final norm; the residual is added before each LayerNorm. transformers has neither, so each is tested against
a numpy transcription of its modeling code (tests/unit/test_convert_gte.py, tests/unit/test_convert_nomic.py).
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from onnx import TensorProto

from sie.worker.convert.encoder_graph import (
    EncoderOutput,
    EncoderWeights,
    add_token_types,
    gelu,
    layer_norm,
    linear,
    padding_biases,
    residual_layer_norm,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import (
    SUPPORTED_ACTIVATIONS,
    EncoderFamily,
    EncoderShape,
    MlmHead,
    check_heads,
    labels_of,
    positive_float,
    positive_int,
    shape_numbers,
)
from sie.worker.convert.graph_builder import GraphBuilder
from sie.worker.convert.rotary import inverse_frequencies, qkv_heads_shape, rotary_attention, rotary_tables

GTE = EncoderFamily(
    "gte", ("new", "gte"), "new.", layer="encoder.layer.{index}", query="", key="", value="",
    attention_output="attention.o_proj", attention_norm="attn_ln", ffn_in="mlp.up_gate_proj",
    ffn_out="mlp.down_proj", ffn_norm="mlp_ln", sequence_classifier="pooler",
    mlm=MlmHead("lm_head.dense", "lm_head.norm", "lm_head.decoder.weight", ("lm_head.decoder.bias",)),
)  # fmt: skip
NOMIC_BERT = EncoderFamily(
    "nomic_bert", ("nomic_bert",), "bert.", layer="encoder.layers.{index}", query="", key="", value="",
    attention_output="attn.out_proj", attention_norm="norm1", ffn_in="mlp.fc11", ffn_out="mlp.fc2", ffn_norm="norm2",
    sequence_classifier="pooler", mlm=None,
)  # fmt: skip
ROTARY_GLU_MODEL_TYPES = ("new", "gte", "nomic_bert")
# Keys whose other values the graph does not build, with the modeling code's default (what a config.json that
# leaves them out gets).
GTE_ONLY: dict[str, Any] = {
    "position_embedding_type": "rope",
    "layer_norm_type": "layer_norm",
    "pack_qkv": True,
    "logn_attention_scale": False,
}
NOMIC_REQUIRED: dict[str, Any] = {"rotary_emb_fraction": 1.0}
# NomicBERT's feed-forward by `activation_function` (NomicBertConfig's default, GPT-2's gelu_new, is built by neither):
# SwiGLU (v1, v1.5) or a plain GELU MLP (v2-moe's dense layers).
NOMIC_FEED_FORWARDS = ("swiglu", "gelu")
# The mixture-of-experts settings at which contrastors' model is megablocks' plain top-k dMoE (what is built).
NOMIC_MOE_ONLY: dict[str, Any] = {
    "num_shared_experts": 0,
    "expert_choice_router": False,
    "moe_normalize_expert_weights": False,
}
NOMIC_ONLY: dict[str, Any] = {
    "prenorm": False,
    "rotary_emb_interleaved": False,
    "rotary_scaling_factor": None,
    "rotary_emb_scale_base": None,
    "use_rms_norm": False,
    "causal": False,
}


@attrs.frozen
class RotaryGluConfig(EncoderShape):
    """The architecture of one GTE or NomicBERT checkpoint; the heads read the same fields of it as of
    `EncoderConfig`."""

    family: EncoderFamily
    rope_theta: float = 10_000.0
    ntk_factor: float = 1.0  # GTE's `rope_scaling: {type: ntk, factor}`; 1: no scaling
    type_vocab_size: int = 1  # 0: no token-type embeddings
    layer_norm_eps: float = 1e-12
    gate_activation: str = "gelu"  # GTE: gelu; NomicBERT: silu
    gated: bool = True  # False: NomicBERT's plain `fc2(gelu(fc1(x)))` (v2-moe)
    experts: int = 0  # NomicBERT v2-moe: experts per mixture-of-experts layer (0: none)
    experts_per_token: int = 0  # its `moe_top_k`
    moe_every: int = 0  # layer i is a mixture of experts when i % moe_every == 1
    attention_bias: bool = True
    fc1_bias: bool = False
    fc2_bias: bool = True
    labels: tuple[str, ...] = ()
    classifier_bias: bool = True
    norm_bias: bool = True
    decoder_bias: bool = True

    @property
    def embeddings_norm(self) -> str:
        return "emb_ln" if self.family is NOMIC_BERT else "embeddings.LayerNorm"

    def is_moe_layer(self, index: int) -> bool:
        return self.experts > 0 and index % self.moe_every == 1


def parse_rotary_glu_config(raw: dict[str, Any], source: str) -> RotaryGluConfig:
    """A GTE or NomicBERT config; what the graph does not build is refused with the field named."""
    if raw.get("model_type") == "nomic_bert":
        return _nomic_config(raw, source)
    act = raw.get("hidden_act", "gelu")
    if act not in SUPPORTED_ACTIVATIONS:
        raise ConversionError(f"hidden_act {act!r} is not supported (only erf 'gelu')", source=source)
    _check_only(raw, GTE_ONLY, source)
    return RotaryGluConfig(
        **shape_numbers(raw, source),
        family=GTE,
        rope_theta=positive_float(raw, "rope_theta", 10_000.0, source),
        ntk_factor=_ntk_factor(raw.get("rope_scaling"), source),
        type_vocab_size=_type_count(raw, "type_vocab_size", 1, source),
        layer_norm_eps=positive_float(raw, "layer_norm_eps", 1e-12, source),
        labels=labels_of(raw.get("id2label"), source),
    )


def _nomic_config(raw: dict[str, Any], source: str) -> RotaryGluConfig:
    for key, expected in NOMIC_REQUIRED.items():  # NomicBertConfig's defaults (GPT-2's gelu, no rotary) differ
        if raw.get(key) != expected:
            raise ConversionError(f"{key} {raw.get(key)!r} is not supported (only {expected!r})", source=source)
    activation = raw.get("activation_function")
    if activation not in NOMIC_FEED_FORWARDS:
        raise ConversionError(f"activation_function {activation!r} is not supported (only "
                              f"{' or '.join(map(repr, NOMIC_FEED_FORWARDS))})", source=source)  # fmt: skip
    _check_only(raw, NOMIC_ONLY, source)
    experts, per_token, every = _nomic_experts(raw, source)
    hidden, heads = positive_int(raw, "n_embd", source), positive_int(raw, "n_head", source)
    check_heads(hidden, heads, source)
    return RotaryGluConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_hidden_layers=positive_int(raw, "n_layer", source),
        intermediate_size=positive_int(raw, "n_inner", source),
        max_position_embeddings=positive_int(raw, "n_positions", source),
        vocab_size=positive_int(raw, "vocab_size", source),
        family=NOMIC_BERT,
        rope_theta=positive_float(raw, "rotary_emb_base", 10_000.0, source),
        type_vocab_size=_type_count(raw, "type_vocab_size", 2, source),
        layer_norm_eps=positive_float(raw, "layer_norm_epsilon", 1e-5, source),
        gate_activation="silu",
        gated=activation == "swiglu",
        experts=experts,
        experts_per_token=per_token,
        moe_every=every,
        attention_bias=bool(raw.get("qkv_proj_bias", True)),
        fc1_bias=bool(raw.get("mlp_fc1_bias", True)),
        fc2_bias=bool(raw.get("mlp_fc2_bias", True)),
        labels=labels_of(raw.get("id2label"), source),
    )


def _nomic_experts(raw: dict[str, Any], source: str) -> tuple[int, int, int]:
    """(experts, experts per token, every how many layers) of a mixture-of-experts NomicBERT; zeros for a dense one."""
    if not raw.get("moe_every_n_layers") or not raw.get("num_experts"):
        return 0, 0, 0
    experts, every = positive_int(raw, "num_experts", source), positive_int(raw, "moe_every_n_layers", source)
    per_token = positive_int(raw, "moe_top_k", source)
    if experts < 2 or per_token > experts:
        raise ConversionError(f"num_experts {experts} with moe_top_k {per_token}: expected 2 or more experts and at "
                              "most that many per token", source=source)  # fmt: skip
    if raw.get("activation_function") != "gelu":
        raise ConversionError(f"activation_function {raw.get('activation_function')!r} with experts: only the GELU "
                              "experts of megablocks' plain MLP are built", source=source)  # fmt: skip
    for key, expected in NOMIC_MOE_ONLY.items():
        value = raw.get(key) or expected  # null: the default
        if value != expected:
            raise ConversionError(f"{key} {value!r} is not supported (only {expected!r})", source=source)
    return experts, per_token, every


def _check_only(raw: dict[str, Any], only: dict[str, Any], source: str) -> None:
    for key, expected in only.items():
        value = raw.get(key, expected)
        if value != expected:
            raise ConversionError(f"{key} {value!r} is not supported (only {expected!r})", source=source)


def _type_count(raw: dict[str, Any], key: str, default: int, source: str) -> int:
    types = raw.get(key, default)
    if not isinstance(types, int) or isinstance(types, bool) or types < 0:
        raise ConversionError(f"{key} {types!r} is not a non-negative integer", source=source)
    return types


def _ntk_factor(scaling: Any, source: str) -> float:
    """The factor of a fixed NTK `rope_scaling` (1.0 without one). The modeling code scales only when the factor
    stretches the cache past max_position_embeddings, so a factor under 1 is refused; a mixed NTK (`mixed_b`) is
    not built."""
    if scaling is None:
        return 1.0
    if not isinstance(scaling, dict):
        raise ConversionError(f"rope_scaling {scaling!r} is not an object", source=source)
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind != "ntk":
        raise ConversionError(f"rope_scaling type {kind!r} is not supported (only 'ntk')", source=source)
    if scaling.get("mixed_b") is not None:
        raise ConversionError(f"rope_scaling mixed_b {scaling['mixed_b']!r} is not supported", source=source)
    factor = positive_float({"rope_scaling factor": scaling.get("factor")}, "rope_scaling factor", None, source)
    if factor < 1.0:
        raise ConversionError(f"rope_scaling factor {factor!r} is under 1", source=source)
    return factor


def build_rotary_glu(builder: GraphBuilder, config: RotaryGluConfig, weights: EncoderWeights) -> EncoderOutput:
    """Embeddings and every layer (there is no final norm); the [B,S,H] output is `last_hidden_state`."""
    b, cfg, family, width = builder, config, config.family, config.hidden_size
    word_table = b.weight(
        "embeddings.word_embeddings.weight", weights.base("embeddings.word_embeddings.weight", (cfg.vocab_size, width))
    )
    embedded = b.op("Gather", [word_table, "input_ids"], "embeddings.words")
    embedded = add_token_types(b, embedded, weights, cfg.type_vocab_size, width)
    embedded = layer_norm(b, embedded, weights.base_layer_norm(cfg.embeddings_norm, width), "embeddings.norm",
                          cfg.layer_norm_eps)  # fmt: skip
    mask, padding_bias = padding_biases(b)
    attention_bias = b.op("Unsqueeze", [padding_bias, b.const([1, 2])], "mask.attention_bias")  # [B,1,1,S]
    length = b.op("Squeeze", [b.op("Shape", ["input_ids"], "shape.length_1d", start=1, end=2), b.const([0])],
                  "shape.length")  # fmt: skip
    steps = b.op("Range", [b.const(0), length, b.const(1)], "rope.steps")
    rotary = rotary_tables(b, steps, inverse_frequencies(cfg.head_size, cfg.rope_theta, cfg.ntk_factor), "rope")
    heads_shape = qkv_heads_shape(b, cfg.num_attention_heads, cfg.head_size)
    tokens = b.op("Reshape", [embedded, b.const([-1, width])], "embeddings.tokens")
    for index in range(cfg.num_hidden_layers):
        prefix = family.layer.format(index=index)
        qkv = weights.linear(f"{weights.prefix}{prefix}.{_qkv_name(family)}", width, 3 * width, cfg.attention_bias)
        out = weights.linear(f"{weights.prefix}{prefix}.{family.attention_output}", width, width, cfg.attention_bias)
        attended = rotary_attention(b, tokens, qkv, out, heads_shape, rotary, attention_bias, cfg.head_size,
                                    f"{prefix}.attention")  # fmt: skip
        tokens = _residual_norm(b, cfg, weights, attended, tokens, f"{prefix}.{family.attention_norm}")
        if cfg.is_moe_layer(index):
            fed = _mixture_of_experts(b, cfg, weights, tokens, prefix)
        elif cfg.gated:
            fed = _gated_feed_forward(b, cfg, weights, tokens, prefix)
        else:
            fed = _plain_feed_forward(b, cfg, weights, tokens, prefix)
        tokens = _residual_norm(b, cfg, weights, fed, tokens, f"{prefix}.{family.ffn_norm}")
    batch_sequence = b.op("Shape", ["input_ids"], "shape.batch_sequence")
    hidden_shape = b.op("Concat", [batch_sequence, b.const([width])], "shape.hidden", axis=0)
    hidden = b.op("Reshape", [tokens, hidden_shape], "last_hidden_state")
    return EncoderOutput(hidden=hidden, tokens=tokens, mask=mask, padding_bias=padding_bias, word_embeddings=word_table)


def _qkv_name(family: EncoderFamily) -> str:
    return "attn.Wqkv" if family is NOMIC_BERT else "attention.qkv_proj"


def _residual_norm(
    b: GraphBuilder, cfg: RotaryGluConfig, weights: EncoderWeights, out: str, residual: str, name: str
) -> str:
    params = weights.base_layer_norm(name, cfg.hidden_size)
    return residual_layer_norm(b, out, residual, params, name, cfg.layer_norm_eps)


def _up_and_gate(cfg: RotaryGluConfig, weights: EncoderWeights, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """The feed-forward's input projection as one [H, 2I] matrix (and bias): `up` then `gate`."""
    width, inner = cfg.hidden_size, cfg.intermediate_size
    if cfg.family is NOMIC_BERT:  # fc11 is up, fc12 the gate
        up = weights.linear(f"{weights.prefix}{prefix}.mlp.fc11", width, inner, cfg.fc1_bias)
        gate = weights.linear(f"{weights.prefix}{prefix}.mlp.fc12", width, inner, cfg.fc1_bias)
        return np.concatenate([up[0], gate[0]], axis=1), np.concatenate([up[1], gate[1]])
    return weights.linear(f"{weights.prefix}{prefix}.mlp.up_gate_proj", width, 2 * inner, cfg.fc1_bias)


def _gated_feed_forward(b: GraphBuilder, cfg: RotaryGluConfig, weights: EncoderWeights, x: str, prefix: str) -> str:
    """`down(up * activation(gate))`, up and gate the two halves of one projection of `x`."""
    inner, family = cfg.intermediate_size, cfg.family
    both = linear(b, x, _up_and_gate(cfg, weights, prefix), f"{prefix}.mlp.up_gate")
    up, gate = b.op_multi("Split", [both, b.const([inner, inner])], [f"{prefix}.mlp.up", f"{prefix}.mlp.gate"],
                          axis=-1)  # fmt: skip
    if cfg.gate_activation == "silu":
        activated = b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{prefix}.mlp.sigmoid")], f"{prefix}.mlp.silu")
    else:
        activated = gelu(b, gate, f"{prefix}.mlp.gelu")
    gated = b.op("Mul", [up, activated], f"{prefix}.mlp.gated")
    down = weights.linear(f"{weights.prefix}{prefix}.{family.ffn_out}", inner, cfg.hidden_size, cfg.fc2_bias)
    return linear(b, gated, down, f"{prefix}.mlp.down")


def _plain_feed_forward(b: GraphBuilder, cfg: RotaryGluConfig, weights: EncoderWeights, x: str, prefix: str) -> str:
    """NomicBertMLP: `fc2(gelu(fc1(x)))`, erf GELU."""
    width, inner = cfg.hidden_size, cfg.intermediate_size
    up = weights.linear(f"{weights.prefix}{prefix}.mlp.fc1", width, inner, cfg.fc1_bias)
    activated = gelu(b, linear(b, x, up, f"{prefix}.mlp.fc1"), f"{prefix}.mlp.gelu")
    down = weights.linear(f"{weights.prefix}{prefix}.mlp.fc2", inner, width, cfg.fc2_bias)
    return linear(b, activated, down, f"{prefix}.mlp.fc2")


def _mixture_of_experts(b: GraphBuilder, cfg: RotaryGluConfig, weights: EncoderWeights, x: str, prefix: str) -> str:
    """megablocks' dMoE over the tokens `x` [N, H]: softmax router, top-k experts per token, each expert's GELU MLP
    run on its own tokens (Gather), weighted and added back in place (ScatterND with `add`), then the shared bias."""
    width, experts, name = cfg.hidden_size, cfg.experts, f"{weights.prefix}{prefix}.mlp"
    router = weights.get(f"{name}.router.layer.weight", (experts, width))
    rows = weights.shape(f"{name}.experts.mlp.w1")[0]
    if rows % experts:
        raise ConversionError(f"has {rows} rows: not {experts} experts' equal parts", source=weights.source,
                              tensor=f"{name}.experts.mlp.w1")  # fmt: skip
    inner = rows // experts
    w1 = weights.get(f"{name}.experts.mlp.w1", (rows, width)).reshape(experts, inner, width)
    w2 = weights.get(f"{name}.experts.mlp.w2", (rows, width)).reshape(experts, inner, width)
    bias = weights.get(f"{name}.experts.bias", (width,))
    logits = b.op(
        "MatMul", [x, b.weight(f"{prefix}.moe.router", np.ascontiguousarray(router.T))], f"{prefix}.moe.logits"
    )
    probabilities = b.op("Softmax", [logits], f"{prefix}.moe.probabilities", axis=-1)
    chosen, picked = b.op_multi("TopK", [probabilities, b.const([cfg.experts_per_token])],
                                [f"{prefix}.moe.weights", f"{prefix}.moe.experts"], axis=-1)  # fmt: skip
    output = b.op("ConstantOfShape", [b.op("Shape", [x], f"{prefix}.moe.shape")], f"{prefix}.moe.zeros")  # float 0
    for expert in range(experts):
        step = f"{prefix}.moe.expert{expert}"
        hit = b.op("Equal", [picked, b.const(np.int64(expert))], f"{step}.hit")  # [N, k]: a token picks it once
        gate = b.op("ReduceSum", [b.op("Where", [hit, chosen, b.const(0.0, np.float32)], f"{step}.hit_weights"),
                                  b.const([1])], f"{step}.gate", keepdims=0)  # fmt: skip
        routed = b.op("ReduceMax", [b.op("Cast", [hit], f"{step}.hit_int", to=TensorProto.INT32)], f"{step}.routed",
                      axes=[1], keepdims=0)  # fmt: skip
        tokens = b.op("NonZero", [routed], f"{step}.tokens")  # [1, M]
        index = b.op("Transpose", [tokens], f"{step}.index", perm=[1, 0])  # [M, 1]
        taken = b.op("GatherND", [x, index], f"{step}.taken")  # [M, H]
        up = b.op("MatMul", [taken, b.weight(f"{step}.w1", np.ascontiguousarray(w1[expert].T))], f"{step}.up")
        down = b.op("MatMul", [gelu(b, up, f"{step}.gelu"), b.weight(f"{step}.w2", np.ascontiguousarray(w2[expert]))],
                    f"{step}.down")  # fmt: skip
        weight = b.op("Unsqueeze", [b.op("GatherND", [gate, index], f"{step}.token_gate"), b.const([1])],
                      f"{step}.token_weight")  # fmt: skip
        weighted = b.op("Mul", [down, weight], f"{step}.weighted")
        output = b.op("ScatterND", [output, index, weighted], f"{step}.added", reduction="add")
    return b.op("Add", [output, b.weight(f"{prefix}.moe.bias", bias)], f"{prefix}.moe.output")
