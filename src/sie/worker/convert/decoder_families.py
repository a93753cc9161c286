"""The decoder families read from a transformers checkpoint: Llama, Mistral, Qwen2, Qwen3, Granite, Gemma 3 (text),
HunYuan (dense v1), Qwen3.5 (text) and Gemma 4 (text).
`parse_decoder_config` reads `config.json` (either RoPE layout: transformers 5's `rope_parameters` or the Hub's
`rope_theta` + `rope_scaling`) into the `DecoderConfig` the graph builds from, with each family's differences:

| family | q/k/v bias | output bias | q/k norm | sliding window |
|---|---|---|---|---|
| llama | `attention_bias` | `attention_bias` | no | no |
| granite | `attention_bias` | `attention_bias` | no | no |
| mistral | no | no | no | `sliding_window`, every layer |
| qwen2 | yes | no | no | `sliding_window` on `layer_types`' sliding layers, when `use_sliding_window` |
| qwen3 | `attention_bias` | `attention_bias` | yes | as qwen2 |
| gemma3_text | `attention_bias` | `attention_bias` | yes | `sliding_window` on `layer_types`' sliding layers (†) |
| hunyuan_v1_dense | `attention_bias` | `attention_bias` | yes, after the rotation | no |

(†) or, without `layer_types`, on every layer but each `sliding_window_pattern`-th.

Granite is Llama with four multipliers: `embedding_multiplier` on the embeddings, `attention_multiplier` as the
query scale, `residual_multiplier` on each block's output before its residual add, and logits divided by
`logits_scaling`. Gemma 3 also: norms that scale by 1 + weight, embeddings times sqrt(hidden), queries scaled by
`query_pre_attn_scalar ** -0.5`, norms after attention and around the MLP, a tanh-GELU gate, the sliding layers'
own RoPE base (`rope_local_base_freq`, or `rope_parameters.sliding_attention`), `final_logit_softcapping`; with
`use_bidirectional_attention` (embeddinggemma) every token sees every other, and a sliding layer those within
`sliding_window // 2` tokens either side, as transformers reads that config.

A config's `is_causal: false` (gte-Qwen2-7B-instruct's, which its remote code reads; transformers reads it too) makes
any family attend both ways, a sliding window then reaching `sliding_window` tokens either side
(`attending_both_ways`); NVIDIA's `llama_bidirec` is Llama read that way. `convert_decoder_hidden(bidirectional=True)`
does the same for a checkpoint whose serving recipe asks for it (GritLM's `forward_kwargs: {is_causal: false}`).
Such a model embeds; it cannot generate.

Qwen3.5 (`qwen3_5_text`, or `qwen3_5` with its vision tower: the language model under `model.language_model.`, the
tower never read; any config whose `text_config` is a `qwen3_5_text` reads the same, as TopK-Embed's remote code's)
puts a gated delta-rule layer (`gated_delta`) in three of every four layers' place (`layer_types`, or every
`full_attention_interval`-th layer attending); its attention layers have per-head q/k norms, RoPE on the first
`partial_rotary_factor` of each head (its multimodal RoPE sections coincide for text) and a sigmoid gate from
`q_proj` on their output; every norm but the delta rule's own scales by 1 + weight.

Gemma 4 (`gemma4_text`, or `gemma4` with its vision and audio towers: the language model under
`model.language_model.`, the towers never read) is Gemma 3's layout with norms that scale by their weight, unscaled
queries, values RMS-normed without a scale, wider heads on the full-attention layers (`global_head_dim` or
`per_layer_config`; `num_global_key_value_heads` where `attention_k_eq_v` makes their keys the values) rotated by a
`proportional` RoPE, the last `num_kv_shared_layers` layers attending over the cache of the last earlier layer of
their kind (with `use_double_wide_mlp`, their MLPs twice as wide), per-layer inputs (`hidden_size_per_layer_input`)
and a stored scalar per layer. Its mixture-of-experts blocks (`enable_moe_block`, the 26B-A4B) are not built, nor
text attending both ways (`use_bidirectional_attention: all`; `vision` leaves text causal).

HunYuan is Llama with a per-head RMSNorm on queries and keys after the rotation (`query_layernorm`,
`key_layernorm`) and, for a `dynamic` RoPE with an `alpha`, a fixed NTK stretch of the base.

`checkpoint_weights` serves a checkpoint's tensors under the graph's names, whether it was saved from the causal-LM
class (`model.layers.…`, `lm_head.weight`) or the bare model (`layers.…`, as the embedding models ship). A Gemma 3
with a vision tower (`gemma3`: config `text_config`, weights under `language_model.`) serves its language model: the
checkpoints that name it take text only (translategemma).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import numpy as np

from sie.worker.convert.decoder_graph import DecoderConfig, DecoderWeights
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gated_delta import GatedDelta
from sie.worker.convert.latent_attention import DECODER_PREFIX as NVEMBED_DECODER_PREFIX
from sie.worker.convert.latent_attention import decoder_config_of
from sie.worker.convert.names import DECODER_MODEL_TYPES, NVEMBED_MODEL_TYPE, QWEN3_5_TEXT_MODEL_TYPE, wraps_qwen3_5
from sie.worker.convert.safetensors_io import Checkpoint

MODEL_PREFIX: Final = "model."
# The families whose `attention_bias` puts a bias on the q, k, v and output projections.
ATTENTION_BIAS_FAMILIES: Final = ("llama", "granite", "qwen3", "hunyuan_v1_dense")
# Where a family stores a tensor under another name than the graph's: HunYuan's per-head q/k norms.
TENSOR_RENAMES: Final = {
    "hunyuan_v1_dense": ((".self_attn.q_norm.", ".self_attn.query_layernorm."),
                         (".self_attn.k_norm.", ".self_attn.key_layernorm.")),
}  # fmt: skip
# Gemma 3 with its vision tower (Gemma3ForConditionalGeneration: translategemma, gemma-3-4b-it): its language model is
# a `gemma3_text` decoder, described by the config's `text_config` and stored under one of these prefixes (the Hub's
# layout, which transformers still saves; transformers' in-memory one), the vision tower beside it.
GEMMA3_WITH_VISION: Final = "gemma3"
# NVIDIA's bidirectional Llama (llama-embed-nemotron-8b, the NeMo retrievers' `LlamaBidirectionalModel` remote code):
# Llama attending both ways, its config's `pooling` and `temperature` aside.
LLAMA_BIDIRECTIONAL: Final = "llama_bidirec"
HUB_LANGUAGE_MODEL: Final = "language_model."
INNER_LANGUAGE_MODEL: Final = "model.language_model."
# Gemma3TextConfig's defaults for what a `text_config` may leave out (the Hub's Gemma 3 configs name only what
# differs); the other keys' defaults are the parser's own.
# Qwen3.5 with its vision tower (Qwen3_5ForConditionalGeneration): its language model is a `qwen3_5_text` decoder.
QWEN3_5_WITH_VISION: Final = "qwen3_5"
QWEN3_5_TEXT: Final = QWEN3_5_TEXT_MODEL_TYPE
# Qwen3-VL (Qwen3VLForConditionalGeneration): its language model is a Qwen3 (`qwen3_vl_text`) whose multimodal RoPE
# sections coincide for text; the deepstack features it adds to its first layers come from images only.
QWEN3_VL: Final = "qwen3_vl"
QWEN3_VL_TEXT: Final = "qwen3_vl_text"
QWEN3_VL_TEXT_DEFAULTS: Final = {"vocab_size": 151_936, "hidden_size": 4096, "intermediate_size": 22_016,
                                 "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128,
                                 "max_position_embeddings": 128_000}  # fmt: skip
# Qwen3_5TextConfig's defaults for what a config may leave out.
QWEN3_5_TEXT_DEFAULTS: Final = {"vocab_size": 248_320, "hidden_size": 4096, "intermediate_size": 12_288,
                                "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
                                "head_dim": 256, "max_position_embeddings": 32_768, "linear_conv_kernel_dim": 4,
                                "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                                "linear_num_value_heads": 32}  # fmt: skip
# Gemma 4 (Gemma4ForConditionalGeneration: its language model a `gemma4_text` under `model.language_model.`, vision
# and audio towers beside it) and Gemma4TextConfig's defaults for what a config may leave out.
GEMMA4: Final = "gemma4"
GEMMA4_TEXT: Final = "gemma4_text"
GEMMA4_TEXT_DEFAULTS: Final = {"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
                               "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
                               "head_dim": 256, "max_position_embeddings": 131_072, "sliding_window": 512,
                               "vocab_size_per_layer_input": 262_144, "hidden_size_per_layer_input": 256}  # fmt: skip
GEMMA3_TEXT_DEFAULTS: Final = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                               "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip


def language_model_config(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The `gemma3_text` config of a Gemma 3 checkpoint with a vision tower: its `text_config` over Gemma3TextConfig's
    defaults; the top level's `tie_word_embeddings` (what the wrapper ties) wins over the text config's, and no final
    logit soft cap (the wrapper's head applies none, whatever the text config names)."""
    text = raw.get("text_config")
    if not isinstance(text, Mapping):
        raise ConversionError("a gemma3 config needs a text_config (its language model)", source=source)
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise ConversionError(f"text_config.model_type {text.get('model_type')!r} is not gemma3_text", source=source)
    config = {**GEMMA3_TEXT_DEFAULTS, **text, "model_type": "gemma3_text", "final_logit_softcapping": None}
    if "tie_word_embeddings" in raw:
        config["tie_word_embeddings"] = raw["tie_word_embeddings"]
    return config


def parse_decoder_config(raw: Mapping[str, Any], source: str) -> DecoderConfig:
    """The DecoderConfig of a decoder checkpoint's config.json; ConversionError names what is missing or unsupported."""
    raw = _in_family_terms(raw, source)
    model_type = raw.get("model_type")
    if model_type not in DECODER_MODEL_TYPES:
        raise ConversionError(
            f"model_type {model_type!r} is not a decoder family this converter builds; expected one of "
            f"{sorted(DECODER_MODEL_TYPES)}",
            source=source,
        )

    def number(key: str, default: Any = None) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConversionError(f"{key} must be a positive integer, got {value!r}", source=source)
        return value

    hidden, heads, layers = number("hidden_size"), number("num_attention_heads"), number("num_hidden_layers")
    kv_heads = number("num_key_value_heads", heads) if raw.get("num_key_value_heads") is not None else heads
    causal = raw.get("is_causal", True)
    if not isinstance(causal, bool):
        raise ConversionError(f"is_causal must be true or false, got {causal!r}", source=source)
    if model_type == "gemma3_text":
        config = _gemma3(raw, hidden, heads, kv_heads, layers, source, number)
        return config if causal else attending_both_ways(config)
    if model_type in OWN_PARSERS:
        parse, defaults = OWN_PARSERS[model_type]
        config = parse({**defaults, **raw}, source)
        return config if causal else attending_both_ways(config)
    head_dim = number("head_dim") if raw.get("head_dim") is not None else hidden // heads
    if raw.get("head_dim") is None and hidden % heads:
        raise ConversionError(f"hidden size {hidden} does not split into {heads} heads", source=source)
    if raw.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act {raw.get('hidden_act')!r} is not supported; expected 'silu'", source=source)
    rope_theta, rope_scaling = _rope(raw, source)
    if model_type == "hunyuan_v1_dense":
        rope_theta, rope_scaling = _ntk_alpha(rope_theta, rope_scaling, head_dim)
    attention_bias = bool(raw.get("attention_bias", False))
    config = DecoderConfig(
        model_type=str(model_type),
        hidden_size=hidden,
        intermediate_size=number("intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=number("vocab_size"),
        max_position_embeddings=number("max_position_embeddings", 2048),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or (model_type in ATTENTION_BIAS_FAMILIES and attention_bias),
        output_bias=model_type in ATTENTION_BIAS_FAMILIES and attention_bias,
        mlp_bias=model_type in ("llama", "granite") and bool(raw.get("mlp_bias", False)),
        qk_norm=model_type in ("qwen3", "hunyuan_v1_dense"),
        qk_norm_after_rotation=model_type == "hunyuan_v1_dense",
        layer_windows=_layer_windows(raw, str(model_type), layers, source),
        **(_granite_multipliers(raw, source) if model_type == "granite" else {}),
    )
    config.check(source)
    return config if causal else attending_both_ways(config)


def _in_family_terms(raw: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """A config that wraps or renames a family as that family's own: a Gemma 3, a Qwen3.5 or a Qwen3-VL with its
    vision tower as its language model's, NVIDIA's `llama_bidirec` as a Llama that is not causal, NV-Embed as its
    decoder (`latent_attention`)."""
    if raw.get("model_type") == GEMMA3_WITH_VISION:
        return language_model_config(raw, source)
    if raw.get("model_type") == QWEN3_5_WITH_VISION or wraps_qwen3_5(raw):
        return _text_model(raw, QWEN3_5_TEXT, QWEN3_5_TEXT, {}, source)
    if raw.get("model_type") == GEMMA4:
        return _text_model(raw, GEMMA4_TEXT, GEMMA4_TEXT, {}, source)
    if raw.get("model_type") == QWEN3_VL:
        return _text_model(raw, QWEN3_VL_TEXT, "qwen3", QWEN3_VL_TEXT_DEFAULTS, source)
    if raw.get("model_type") == LLAMA_BIDIRECTIONAL:
        return {**raw, "model_type": "llama", "is_causal": False}
    if raw.get("model_type") == NVEMBED_MODEL_TYPE:
        return decoder_config_of(raw, source)
    return raw


def _text_model(
    raw: Mapping[str, Any], text_type: str, family: str, defaults: Mapping[str, Any], source: str
) -> dict[str, Any]:
    """The language model's config of a checkpoint with a vision tower: its `text_config` (of `text_type`) over the
    text config class's `defaults`, read as `family`; the top level's `tie_word_embeddings` (what the wrapper ties)
    wins over the text config's."""
    text = raw.get("text_config")
    if not isinstance(text, Mapping) or text.get("model_type", text_type) != text_type:
        raise ConversionError(f"a {raw.get('model_type')} config needs a {text_type} text_config (its language model)",
                              source=source)  # fmt: skip
    tied = {"tie_word_embeddings": raw["tie_word_embeddings"]} if "tie_word_embeddings" in raw else {}
    return {**defaults, **text, "model_type": family, **tied}


def attending_both_ways(config: DecoderConfig) -> DecoderConfig:
    """`config` with every token seeing every other, as transformers runs a decoder whose config (or forward call)
    says `is_causal=False`: a sliding window then reaches `sliding_window` tokens either side, that one included. A
    config that attends both ways already (embeddinggemma's) stays as it is."""
    if not config.causal:
        return config
    windows = tuple(None if window is None else window + 1 for window in config.layer_windows)
    return attrs.evolve(config, causal=False, layer_windows=windows)


def _ntk_alpha(theta: float, scaling: Mapping[str, Any], head_dim: int) -> tuple[float, Mapping[str, Any]]:
    """HunYuan's `dynamic` RoPE with an `alpha`: a fixed NTK stretch of the base, theta × alpha^(d / (d − 2))
    (transformers' `ntk_alpha`), the same at every length. Without an alpha `dynamic` follows the sequence length,
    which the graph's fixed tables do not: it stays as it is and the config check names it."""
    alpha = scaling.get("alpha")
    if scaling.get("rope_type") != "dynamic" or not alpha:
        return theta, scaling
    return theta * float(alpha) ** (head_dim / (head_dim - 2)), {}


def _granite_multipliers(raw: Mapping[str, Any], source: str) -> dict[str, float]:
    def positive(key: str) -> float:
        value = raw.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConversionError(f"{key} must be a positive number, got {value!r}", source=source)
        return float(value)

    return {"embedding_multiplier": positive("embedding_multiplier"),
            "attention_scale": positive("attention_multiplier"),
            "residual_multiplier": positive("residual_multiplier"),
            "logits_divisor": positive("logits_scaling")}  # fmt: skip


def _gemma3(  # noqa: PLR0913 - the numbers parse_decoder_config read already
    raw: Mapping[str, Any], hidden: int, heads: int, kv_heads: int, layers: int, source: str, number: Any
) -> DecoderConfig:
    if raw.get("attn_logit_softcapping") is not None:
        raise ConversionError("attn_logit_softcapping is not supported", source=source)
    parameters = raw.get("rope_parameters") or {}
    if "full_attention" in parameters:  # transformers 5: one RoPE per layer type
        global_rope = dict(parameters["full_attention"])
        local_rope = dict(parameters.get("sliding_attention") or {})
    else:
        global_rope = {**dict(raw.get("rope_scaling") or {}), "rope_theta": raw.get("rope_theta", 1_000_000.0)}
        local_rope = {"rope_theta": raw.get("rope_local_base_freq", 10_000.0)}
    if local_rope.get("rope_type", "default") != "default":
        raise ConversionError("a scaled RoPE on the sliding layers is not supported", source=source)
    theta, scaling = _rope({"rope_parameters": global_rope}, source)
    types = raw.get("layer_types")
    if types is None:
        pattern = raw.get("sliding_window_pattern", 6)
        types = ["sliding_attention" if (index + 1) % pattern else "full_attention" for index in range(layers)]
    bidirectional = bool(raw.get("use_bidirectional_attention", False))
    config = DecoderConfig(
        model_type="gemma3_text",
        hidden_size=hidden,
        intermediate_size=number("intermediate_size"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=number("head_dim", 256),
        vocab_size=number("vocab_size"),
        max_position_embeddings=number("max_position_embeddings", 131_072),
        rope_theta=theta,
        rope_scaling=scaling,
        norm_offset=1.0,
        attention_scale=float(raw.get("query_pre_attn_scalar", 256)) ** -0.5,
        **_gemma_layout(raw, hidden, types, raw.get("sliding_window", 4096), bidirectional, source),
        local_rope_theta=float(local_rope.get("rope_theta", 10_000.0)),
    )
    config.check(source)
    return config


def _gemma_layout(  # noqa: PLR0913 - what each Gemma parser read its own way
    raw: Mapping[str, Any], hidden: int, types: list[str], window: Any, bidirectional: bool, source: str
) -> dict[str, Any]:
    """What Gemma 3 and Gemma 4 share, as DecoderConfig fields: a tanh-GELU MLP, norms before and after attention and
    the MLP, per-head q/k norms, embeddings times sqrt(hidden), windowed layers (a model attending both ways sees
    |query − key| < window // 2 + 1, as transformers reads its config), biases as `attention_bias` says, a soft cap
    on the logits."""
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ConversionError(f"hidden_activation {activation!r} is not supported; expected a tanh GELU", source=source)
    if isinstance(window, int) and not isinstance(window, bool) and bidirectional:
        window = window // 2 + 1
    attention_bias = bool(raw.get("attention_bias", False))
    return {
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
        "qkv_bias": attention_bias,
        "output_bias": attention_bias,
        "qk_norm": True,
        "layer_windows": _windows_of_types(types, window, len(types), source),
        "embedding_multiplier": float(np.float32(hidden**0.5)),
        "sandwich_norms": True,
        "activation": "gelu_tanh",
        "final_logit_softcap": raw.get("final_logit_softcapping"),
        "causal": not bidirectional,
    }


def _qwen3_5(raw: Mapping[str, Any], source: str) -> DecoderConfig:
    number = functools.partial(_positive, raw, source=source)
    if raw.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act {raw.get('hidden_act')!r} is not supported; expected 'silu'", source=source)
    if raw.get("attention_bias", False):
        raise ConversionError("attention_bias is not supported on a gated Qwen3.5 attention", source=source)
    layers, head_dim = number("num_hidden_layers"), number("head_dim")
    types = raw.get("layer_types")
    if types is None:
        interval = raw.get("full_attention_interval", 4)
        types = ["linear_attention" if (index + 1) % interval else "full_attention" for index in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - {"linear_attention", "full_attention"}:
        raise ConversionError(f"layer_types must list linear_attention or full_attention for each of the {layers} "
                              "layers", source=source)  # fmt: skip
    parameters = dict(raw.get("rope_parameters") or {})
    factor = parameters.pop("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))
    for multimodal in ("mrope_section", "mrope_interleaved"):  # positions of text: every section reads the same one
        parameters.pop(multimodal, None)
    theta, scaling = _rope({"rope_parameters": parameters, "rope_theta": raw.get("rope_theta", 10_000.0)}, source)
    linear = GatedDelta(
        layers=tuple(index for index, kind in enumerate(types) if kind == "linear_attention"),
        num_key_heads=number("linear_num_key_heads"),
        num_value_heads=number("linear_num_value_heads"),
        key_head_dim=number("linear_key_head_dim"),
        value_head_dim=number("linear_value_head_dim"),
        conv_kernel=number("linear_conv_kernel_dim"),
    )
    config = DecoderConfig(
        model_type=QWEN3_5_TEXT,
        **_shape_numbers(raw, source),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qk_norm=True,
        norm_offset=1.0,
        rotary_dim=int(head_dim * float(factor)),
        attention_output_gate=True,
        linear_attention=linear,
    )
    config.check(source)
    return config


def _gemma4(raw: Mapping[str, Any], source: str) -> DecoderConfig:
    number = functools.partial(_positive, raw, source=source)
    if raw.get("enable_moe_block"):
        raise ConversionError("Gemma 4's mixture-of-experts blocks (enable_moe_block) are not built", source=source)
    layers = number("num_hidden_layers")
    types = raw.get("layer_types")
    if types is None:  # five sliding layers to one full one, as Gemma4TextConfig fills them in
        types = ["sliding_attention" if (index + 1) % 6 else "full_attention" for index in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise ConversionError(f"layer_types must list sliding_attention or full_attention for each of the {layers} "
                              "layers", source=source)  # fmt: skip
    types = [*types[:-1], "full_attention"]  # transformers forces the last layer to attend fully
    if raw.get("use_bidirectional_attention") == "all":  # "vision" is images only: text stays causal
        raise ConversionError("Gemma 4 attending both ways (use_bidirectional_attention: all) is not built",
                              source=source)  # fmt: skip
    theta, scaling, local_theta = _gemma4_rope(raw, source)
    ple_size = raw.get("hidden_size_per_layer_input") or 0
    config = DecoderConfig(
        model_type=GEMMA4_TEXT,
        **_shape_numbers(raw, source),
        rope_theta=theta,
        rope_scaling=scaling,
        attention_scale=1.0,
        **_gemma_layout(raw, number("hidden_size"), types, raw.get("sliding_window"), False, source),
        local_rope_theta=local_theta,
        value_norm=True,
        keys_as_values=bool(raw.get("attention_k_eq_v", False)),
        per_layer_input_size=number("hidden_size_per_layer_input") if ple_size else 0,
        per_layer_vocab_size=number("vocab_size_per_layer_input") if ple_size else 0,
        layer_scalars=True,
        **_gemma4_layers(raw, types, source),
    )
    config.check(source)
    return config


def _gemma4_layers(raw: Mapping[str, Any], types: list[str], source: str) -> dict[str, tuple[int, ...]]:
    """Gemma 4's per-layer shapes, as DecoderConfig fields (left out where every layer has the same): the full-attention
    layers' head size and key/value heads (per_layer_config's, which transformers 5 saves; else `global_head_dim` and,
    where the keys are the values, `num_global_key_value_heads`), the layer whose cache each reads (the last
    `num_kv_shared_layers` read the last earlier layer of their kind) and, with `use_double_wide_mlp`, those shared
    layers' MLPs twice as wide."""
    layers = len(types)
    per_layer = raw.get("per_layer_config")
    if isinstance(per_layer, Mapping) and per_layer:
        overrides = {int(index): dict(values) for index, values in per_layer.items()}
    else:
        full = {"head_dim": raw.get("global_head_dim", 512)}
        if raw.get("attention_k_eq_v") and raw.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = raw["num_global_key_value_heads"]
        overrides = {index: full for index, kind in enumerate(types) if kind == "full_attention"}
    head_dims = tuple(int(overrides.get(index, {}).get("head_dim", raw["head_dim"])) for index in range(layers))
    kv_heads = tuple(int(overrides.get(index, {}).get("num_key_value_heads", raw["num_key_value_heads"]))
                     for index in range(layers))  # fmt: skip
    shared = raw.get("num_kv_shared_layers") or 0
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared < layers:
        raise ConversionError(f"num_kv_shared_layers must be an integer from 0 to {layers - 1}, got {shared!r}",
                              source=source)  # fmt: skip
    first_shared = layers - shared
    sources = list(range(layers))
    for index in range(first_shared, layers):
        earlier = [layer for layer in range(first_shared) if types[layer] == types[index]]
        if not earlier:
            raise ConversionError(f"layer {index} shares the cache of a {types[index]} layer, and none comes before "
                                  "the shared ones", source=source)  # fmt: skip
        sources[index] = earlier[-1]
    wide = bool(raw.get("use_double_wide_mlp", False)) and shared > 0
    intermediate = raw["intermediate_size"]
    return {
        "layer_head_dims": head_dims if len(set(head_dims)) > 1 else (),
        "layer_kv_heads": kv_heads if len(set(kv_heads)) > 1 else (),
        "kv_sources": tuple(sources) if shared else (),
        "layer_intermediate_sizes": tuple(2 * intermediate if index >= first_shared else intermediate
                                          for index in range(layers)) if wide else (),
    }  # fmt: skip


def _gemma4_rope(raw: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any], float]:
    """Gemma 4's RoPE per layer kind: the full-attention layers' base and scaling (`proportional`: a quarter of the
    pairs, by default) and the sliding layers' base (unscaled)."""
    parameters = raw.get("rope_parameters") or {}
    local_rope = dict(parameters.get("sliding_attention") or {"rope_theta": 10_000.0})
    global_rope = dict(parameters.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                            "rope_theta": 1_000_000.0})  # fmt: skip
    if local_rope.get("rope_type", "default") != "default":
        raise ConversionError("a scaled RoPE on the sliding layers is not supported", source=source)
    local_theta = float(local_rope.get("rope_theta", 10_000.0))
    if global_rope.get("rope_type") == "proportional":
        kept = ("rope_type", "partial_rotary_factor", "factor")
        return float(global_rope.get("rope_theta", 10_000.0)), {key: global_rope[key] for key in kept
                                                                 if key in global_rope}, local_theta  # fmt: skip
    global_rope.pop("partial_rotary_factor", None)  # Gemma 4's default RoPE rotates the whole head
    theta, scaling = _rope({"rope_parameters": global_rope}, source)
    return theta, scaling, local_theta


# The families read by a parser of their own, each over its config class's defaults.
OWN_PARSERS: Final[dict[str, tuple[Callable[[Mapping[str, Any], str], DecoderConfig], Mapping[str, Any]]]] = {
    QWEN3_5_TEXT: (_qwen3_5, QWEN3_5_TEXT_DEFAULTS),
    GEMMA4_TEXT: (_gemma4, GEMMA4_TEXT_DEFAULTS),
}


def _positive(raw: Mapping[str, Any], key: str, source: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConversionError(f"{key} must be a positive integer, got {value!r}", source=source)
    return value


def _shape_numbers(raw: Mapping[str, Any], source: str) -> dict[str, int]:
    """A decoder's sizes, as DecoderConfig fields of the same names, each a positive integer of the config."""
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "max_position_embeddings")  # fmt: skip
    return {key: _positive(raw, key, source) for key in keys}


def _windows_of_types(types: Any, window: Any, layers: int, source: str) -> tuple[int | None, ...]:
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ConversionError(f"sliding_window must be a positive integer, got {window!r}", source=source)
    if not isinstance(types, list) or len(types) != layers:
        raise ConversionError(f"layer_types must list one type per layer ({layers})", source=source)
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def _rope(raw: Mapping[str, Any], source: str) -> tuple[float, dict[str, Any]]:
    """The RoPE base and scaling parameters from either layout; `{}` means unscaled."""
    parameters = dict(raw.get("rope_parameters") or {})
    if raw.get("rope_scaling"):
        parameters.update(raw["rope_scaling"])
    theta = parameters.pop("rope_theta", raw.get("rope_theta", 10_000.0))
    if "type" in parameters and "rope_type" not in parameters:  # the older spelling
        parameters["rope_type"] = parameters.pop("type")
    if parameters.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConversionError("partial rotary embeddings are not supported", source=source)
    if parameters.get("rope_type", "default") == "default":
        parameters = {}
    if not isinstance(theta, int | float) or theta <= 0:
        raise ConversionError(f"rope_theta must be a positive number, got {theta!r}", source=source)
    return float(theta), parameters


def _layer_windows(raw: Mapping[str, Any], model_type: str, layers: int, source: str) -> tuple[int | None, ...]:
    window = raw.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        window = None
    if window is None:
        return ()
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ConversionError(f"sliding_window must be a positive integer or null, got {window!r}", source=source)
    if model_type == "mistral":
        return (window,) * layers
    types = raw.get("layer_types")
    if types is None:
        first_sliding = raw.get("max_window_layers", layers)
        types = ["sliding_attention" if index >= first_sliding else "full_attention" for index in range(layers)]
    return _windows_of_types(types, window, layers, source)


def checkpoint_weights(checkpoint: Checkpoint, config: DecoderConfig) -> DecoderWeights:
    """The checkpoint's tensors under the graph's names: a bare model's (`layers.0…`, `embed_tokens.weight`) get the
    `model.` prefix a causal LM's carry; a Gemma 3 with a vision tower serves its language model's (the tower and its
    projector are never read); NV-Embed's decoder is stored under `embedding_model.`."""
    bare = "model.embed_tokens.weight" not in checkpoint and "embed_tokens.weight" in checkpoint
    hub_layout = f"{HUB_LANGUAGE_MODEL}model.embed_tokens.weight" in checkpoint
    inner_layout = f"{INNER_LANGUAGE_MODEL}embed_tokens.weight" in checkpoint
    nvembed_layout = f"{NVEMBED_DECODER_PREFIX}embed_tokens.weight" in checkpoint

    renames = TENSOR_RENAMES.get(config.model_type, ())

    def stored(name: str) -> str:
        for graph_part, checkpoint_part in renames:
            name = name.replace(graph_part, checkpoint_part)
        if hub_layout:  # language_model.model.layers…, language_model.lm_head.weight
            return HUB_LANGUAGE_MODEL + name
        if inner_layout and name.startswith(MODEL_PREFIX):  # model.language_model.layers…, lm_head.weight
            return INNER_LANGUAGE_MODEL + name.removeprefix(MODEL_PREFIX)
        if nvembed_layout and name.startswith(MODEL_PREFIX):  # embedding_model.layers…
            return NVEMBED_DECODER_PREFIX + name.removeprefix(MODEL_PREFIX)
        return name.removeprefix(MODEL_PREFIX) if bare and name.startswith(MODEL_PREFIX) else name

    return DecoderWeights(
        config,
        lambda name: checkpoint.load(stored(name)),
        lambda name: stored(name) in checkpoint,
        str(checkpoint.path),
    )
