"""Reading a decoder checkpoint's config.json (sie.worker.convert.decoder_families): each family's options, both RoPE
layouts, the sliding window per layer, and the errors that name what is not built."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sie.worker.convert import ConversionError
from sie.worker.convert.decoder_families import parse_decoder_config
from sie.worker.convert.decoder_graph import rope_frequencies
from sie.worker.convert.names import is_decoder_config

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 512}  # fmt: skip


def parse(model_type: str, **fields: object):
    return parse_decoder_config({"model_type": model_type, **BASE, **fields}, "config.json")


def test_a_gemma3_with_a_vision_tower_reads_its_text_config_over_the_defaults() -> None:
    """translategemma's config: `gemma3` with the language model in `text_config`, which names only what differs
    from Gemma3TextConfig's defaults (the Hub's Gemma 3 configs leave out the vocabulary and the head counts)."""
    raw = {"model_type": "gemma3", "tie_word_embeddings": True, "eos_token_id": [1, 106],
           "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                           "num_hidden_layers": 34, "sliding_window": 1024, "final_logit_softcapping": 30.0,
                           "tie_word_embeddings": False, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
           "vision_config": {"model_type": "siglip_vision_model"}}  # fmt: skip
    config = parse_decoder_config(raw, "config.json")
    assert (config.model_type, config.vocab_size, config.num_attention_heads, config.num_key_value_heads) == (
        "gemma3_text", 262_208, 8, 4,
    )  # fmt: skip
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (2560, 34, 256)
    # the wrapper ties what its top level says and caps no logits (transformers' Gemma3ForConditionalGeneration)
    assert config.tie_word_embeddings and config.final_logit_softcap is None
    assert config.layer_windows[:6] == (1024, 1024, 1024, 1024, 1024, None) and is_decoder_config(raw)


def test_hunyuan_norms_after_the_rotation_and_stretches_its_rope_base_by_alpha() -> None:
    hunyuan = parse("hunyuan_v1_dense", head_dim=16, attention_bias=True, rope_theta=10_000.0,
                    rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32})  # fmt: skip
    assert (hunyuan.qk_norm, hunyuan.qk_norm_after_rotation, hunyuan.qkv_bias, hunyuan.output_bias) == (
        True, True, True, True,
    )  # fmt: skip
    assert math.isclose(hunyuan.rope_theta, 10_000.0 * 1000.0 ** (16 / 14)) and dict(hunyuan.rope_scaling) == {}
    assert not hunyuan.mlp_bias and parse("qwen3").qk_norm_after_rotation is False
    # without an alpha, `dynamic` follows the sequence length: not built
    with pytest.raises(ConversionError, match="RoPE type 'dynamic' is not supported"):
        parse("hunyuan_v1_dense", rope_scaling={"rope_type": "dynamic", "factor": 2.0})


def test_each_family_gets_its_own_options() -> None:
    llama = parse("llama", attention_bias=True, mlp_bias=True)
    assert (llama.qkv_bias, llama.output_bias, llama.mlp_bias, llama.qk_norm) == (True, True, True, False)
    qwen2 = parse("qwen2", attention_bias=True)  # Qwen2 has q/k/v biases whatever the config says, never o_proj's
    assert (qwen2.qkv_bias, qwen2.output_bias, qwen2.mlp_bias, qwen2.qk_norm) == (True, False, False, False)
    qwen3 = parse("qwen3", head_dim=32)
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim, qwen3.query_groups) == (False, True, 32, 4)
    mistral = parse("mistral", sliding_window=16)
    assert (mistral.qkv_bias, mistral.layer_windows, mistral.head_dim) == (False, (16, 16, 16, 16), 8)
    assert parse("llama").tie_word_embeddings is False and parse("qwen3", tie_word_embeddings=True).tie_word_embeddings


def test_gemma3_reads_its_own_layout() -> None:
    hub = parse("gemma3_text", head_dim=16, query_pre_attn_scalar=64, sliding_window=512, sliding_window_pattern=2,
                rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0},
                hidden_activation="gelu_pytorch_tanh")  # fmt: skip
    assert hub.layer_windows == (512, None, 512, None) and (hub.rope_theta, hub.local_rope_theta) == (1e6, 1e4)
    assert dict(hub.rope_scaling) == {"rope_type": "linear", "factor": 8.0} and hub.query_scale == 64**-0.5
    assert (hub.norm_offset, hub.sandwich_norms, hub.activation, hub.causal, hub.qk_norm) == (
        1.0, True, "gelu_tanh", True, True,
    )  # fmt: skip
    assert math.isclose(hub.embedding_multiplier, 8.0) and hub.tie_word_embeddings  # sqrt(64)
    assert [hub.rope_of(layer) for layer in range(4)] == ["local", "global", "local", "global"]
    rope_parameters = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    embedding = parse(
        "gemma3_text",
        head_dim=16,
        sliding_window=512,
        use_bidirectional_attention=True,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters=rope_parameters,
    )
    assert not embedding.causal and embedding.layer_windows == (257, None, 257, None)  # |q - k| < 512 // 2 + 1
    with pytest.raises(ConversionError, match="expected a tanh GELU"):
        parse("gemma3_text", hidden_activation="relu")


def test_qwen_windows_follow_use_sliding_window_and_the_layer_types() -> None:
    assert parse("qwen2", sliding_window=16).layer_windows == ()  # use_sliding_window is off by default
    assert parse("qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=2).layer_windows == (
        None, None, 16, 16,
    )  # fmt: skip
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    windowed = parse("qwen3", sliding_window=8, use_sliding_window=True, layer_types=types)
    assert windowed.layer_windows == (8, None, 8, None)
    with pytest.raises(ConversionError, match="one type per layer"):
        parse("qwen3", sliding_window=8, use_sliding_window=True, layer_types=["full_attention"])


def test_both_rope_layouts_read_the_same() -> None:
    hub = parse("llama", rope_theta=500_000.0,
                rope_scaling={"type": "linear", "factor": 2.0})  # fmt: skip
    current = parse("llama", rope_parameters={"rope_type": "linear", "rope_theta": 500_000.0, "factor": 2.0})
    assert hub.rope_theta == current.rope_theta == 500_000.0
    assert dict(hub.rope_scaling) == dict(current.rope_scaling) == {"rope_type": "linear", "factor": 2.0}
    assert parse("qwen3", rope_parameters={"rope_type": "default", "rope_theta": 1e6}).rope_scaling == {}


def test_rope_frequencies_of_each_type() -> None:
    default, factor = rope_frequencies(parse("llama", rope_theta=10_000.0))
    assert factor == 1.0 and default[0] == 1.0 and math.isclose(default[1], 10_000.0 ** (-2 / 8))
    linear, _ = rope_frequencies(parse("llama", rope_scaling={"rope_type": "linear", "factor": 4.0}))
    np.testing.assert_allclose(linear, default / 4)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # fmt: skip
    llama3, _ = rope_frequencies(parse("llama", rope_scaling=scaling))
    wavelengths = 2 * math.pi / default
    assert llama3[wavelengths < 16][0] == default[0]  # high frequencies kept
    np.testing.assert_allclose(llama3[wavelengths > 64], default[wavelengths > 64] / 8)  # low ones divided
    _, yarn_factor = rope_frequencies(
        parse("qwen3", rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128})
    )
    assert math.isclose(yarn_factor, 0.1 * math.log(4.0) + 1.0)


def test_qwen3_5_reads_its_layer_types_partial_rotary_and_linear_attention_sizes() -> None:
    """Qwen3.5-4B's config as the Hub has it: `qwen3_5` with the language model in `text_config` (multimodal RoPE
    sections, a quarter of each head rotated), every fourth layer attending when no `layer_types` are listed."""
    text = {"model_type": "qwen3_5_text", **BASE, "num_hidden_layers": 8, "head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
            "full_attention_interval": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}}  # fmt: skip
    config = parse_decoder_config({"model_type": "qwen3_5", "tie_word_embeddings": True, "text_config": text}, "c")
    assert (config.model_type, config.rotary_width, config.rope_theta, dict(config.rope_scaling)) == (
        "qwen3_5_text", 4, 1e7, {},
    )  # fmt: skip
    assert config.linear_attention.layers == (0, 1, 2, 4, 5, 6)
    assert [config.attends(layer) for layer in (2, 3, 7)] == [False, True, True]
    assert config.linear_attention.conv_channels == 2 * 2 * 8 + 4 * 12 and config.linear_attention.conv_kernel == 4
    assert (config.qk_norm, config.norm_offset, config.attention_output_gate, config.tie_word_embeddings) == (
        True, 1.0, True, True,
    )  # fmt: skip
    for refused, message in [({"linear_num_value_heads": 3}, "3 linear-attention value heads do not group over 2"),
                             ({"attention_bias": True}, "attention_bias is not supported"),
                             ({"layer_types": ["full_attention"]}, "layer_types must list")]:  # fmt: skip
        with pytest.raises(ConversionError, match=message):
            parse_decoder_config({**text, **refused}, "config.json")


def test_qwen3_vl_reads_its_text_config_as_a_qwen3() -> None:
    """Qwen3-VL-8B-Instruct's config: `qwen3_vl`, the language model in a `qwen3_vl_text` text_config over its class's
    defaults, multimodal RoPE sections in `rope_parameters` (they coincide for text), untied unless the top says."""
    text = {"model_type": "qwen3_vl_text", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "vocab_size": 151936,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20],
                                "mrope_interleaved": True}}  # fmt: skip
    config = parse_decoder_config({"model_type": "qwen3_vl", "text_config": text, "vision_config": {}}, "c")
    assert (config.model_type, config.num_attention_heads, config.head_dim, config.qk_norm) == ("qwen3", 32, 128, True)
    assert (config.rope_theta, dict(config.rope_scaling), config.tie_word_embeddings) == (5e6, {}, False)
    with pytest.raises(ConversionError, match="a qwen3_vl config needs a qwen3_vl_text text_config"):
        parse_decoder_config({"model_type": "qwen3_vl", "text_config": {"model_type": "qwen2"}}, "c")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "qwen3_moe", **BASE}, "model_type 'qwen3_moe' is not a decoder family"),
        ({"model_type": "gemma3n", **BASE}, "model_type 'gemma3n'"),
        ({"model_type": "gemma3", **BASE}, "a gemma3 config needs a text_config"),
        ({"model_type": "gemma3", "text_config": {"model_type": "llama"}}, "text_config.model_type 'llama'"),
        ({"model_type": "llama", **BASE, "hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"model_type": "llama", **BASE, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ({"model_type": "llama", **BASE, "rope_parameters": {"partial_rotary_factor": 0.5}}, "partial rotary"),
        ({"model_type": "llama", **BASE, "num_key_value_heads": 3}, "do not group"),
        ({"model_type": "llama", **BASE, "vocab_size": 0}, "vocab_size must be a positive integer"),
        ({"model_type": "mistral", **BASE, "sliding_window": -1}, "sliding_window"),
    ],
)  # fmt: skip
def test_what_is_not_built_is_named(config: dict, message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        parse_decoder_config(config, "config.json")


def test_decoder_configs_are_told_from_encoder_ones() -> None:
    assert is_decoder_config({"model_type": "qwen2"}) and not is_decoder_config({"model_type": "bert"})


# gemma-4-E2B-it's config.json as the Hub writes it: the language model in `text_config`, the full-attention layers'
# head size as `global_head_dim` (no per_layer_config), 20 of 35 layers reading an earlier layer's cache
E2B_TEXT = {"model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35,
            "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
            "sliding_window": 512, "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
            "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "hidden_size_per_layer_input": 256,
            "vocab_size": 262_144, "vocab_size_per_layer_input": 262_144, "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh", "attention_k_eq_v": False, "enable_moe_block": False,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1_000_000.0}}}  # fmt: skip


def test_gemma4_reads_its_layers_heads_shared_caches_and_per_layer_inputs() -> None:
    raw = {"model_type": "gemma4", "tie_word_embeddings": True, "text_config": E2B_TEXT,
           "vision_config": {"model_type": "gemma4_vision"},
           "audio_config": {"model_type": "gemma4_audio"}}  # fmt: skip
    config = parse_decoder_config(raw, "config.json")
    assert is_decoder_config(raw) and config.model_type == "gemma4_text"
    assert [config.head_dim_of(layer) for layer in range(5)] == [256, 256, 256, 256, 512]
    assert config.kv_heads_of(4) == 1 and not config.values_from_keys(4)
    # layers 15… read the last of layers 0–14 of their kind: 13 (sliding) or 14 (full), and keep no cache
    assert [config.kv_source(layer) for layer in (14, 15, 19, 34)] == [14, 13, 14, 14]
    assert sorted(config.cache_layers()) == list(range(15))
    assert [config.intermediate_size_of(layer) for layer in (14, 15)] == [6144, 12_288]
    ple = (config.per_layer_input_size, config.per_layer_vocab_size, config.final_logit_softcap)
    assert ple == (256, 262_144, 30.0)
    assert config.attention_scale == 1.0 and config.norm_offset == 0.0 and config.value_norm and config.layer_scalars
    # proportional RoPE: the full layers' first quarter of pairs rotate with the whole head's exponents, the rest not
    inverse, factor = rope_frequencies(config, "global", 512)
    assert inverse.shape == (256,) and factor == 1.0 and not inverse[64:].any()
    assert np.allclose(inverse[:64], 1e6 ** (-np.arange(0, 128, 2) / 512))
    local, _ = rope_frequencies(config, "local", 256)
    assert np.allclose(local, 1e4 ** (-np.arange(0, 256, 2) / 256))


def test_gemma4_keys_as_values_and_what_is_not_built() -> None:
    """The 31B's full-attention layers use their keys as values with their own key/value head count; the 26B-A4B's
    mixture-of-experts blocks are not built, nor text attending both ways (no catalogue Gemma 4 asks for it; images
    only, `vision`, leaves text causal), and a shared layer with no earlier layer of its kind is refused."""
    dense = parse_decoder_config({**E2B_TEXT, "attention_k_eq_v": True, "num_global_key_value_heads": 4,
                                  "num_kv_shared_layers": 0}, "config.json")  # fmt: skip
    assert dense.values_from_keys(4) and not dense.values_from_keys(3)
    assert (dense.kv_heads_of(4), dense.kv_heads_of(3), dense.kv_sources) == (4, 1, ())
    with pytest.raises(ConversionError, match=r"mixture-of-experts blocks \(enable_moe_block\) are not built"):
        parse_decoder_config({**E2B_TEXT, "enable_moe_block": True}, "config.json")
    with pytest.raises(ConversionError, match=r"use_bidirectional_attention: all\) is not built"):
        parse_decoder_config({**E2B_TEXT, "use_bidirectional_attention": "all"}, "config.json")
    assert parse_decoder_config({**E2B_TEXT, "use_bidirectional_attention": "vision"}, "config.json").causal
    with pytest.raises(ConversionError, match="none comes before the shared ones"):
        parse_decoder_config({**E2B_TEXT, "layer_types": ["sliding_attention"] * 34 + ["full_attention"]},
                             "config.json")  # fmt: skip
