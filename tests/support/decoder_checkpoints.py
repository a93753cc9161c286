"""Tiny random checkpoints of each decoder family (Llama, Mistral, Qwen2, Qwen3, Granite, Gemma 3, HunYuan, Qwen3.5),
built and saved by transformers itself with the family's real options switched on (biases, q/k norms, sliding windows
shorter than the test prompts, explicit head sizes, tied embeddings, each RoPE scaling type, Granite's multipliers,
Gemma's norms, HunYuan's NTK alpha, Qwen3.5's linear attention), and a word-level `tokenizer.json` with a ChatML
template. torch and transformers (the test extra) are imported when a model is built, not when this module is
imported: pytest-xdist collects every module on every worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from sie.catalog import parse_model_config
from sie.worker.generation.kv_cache import CacheShape, empty_cache, next_cache

if TYPE_CHECKING:
    import torch

VOCAB = 64
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
SCORE_WORDS = ("yes", "no", "1", "0")  # the rerankers' score tokens
WORDS = [*SCORE_WORDS, *(f"w{index}" for index in range(VOCAB - len(SPECIALS) - len(SCORE_WORDS)))]
END_OF_TEXT, IM_START, IM_END = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' ' + message['content'] + '<|im_end|>'}}"
    "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant'}}{% endif %}"
)

COMMON = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 128,
          "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}  # fmt: skip
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "granite", "gemma3", "hunyuan", "qwen3_5", "gemma4")
WINDOW = 3  # tokens: shorter than the test prompts, so a window that is not applied changes the answer


def family_config(family: str) -> Any:
    """The family's transformers config, tiny, with the options that set it apart."""
    import transformers

    configs = {
        # biases on attention and MLP; Llama 3.1's RoPE scaling
        "llama": lambda: transformers.LlamaConfig(
            **COMMON, attention_bias=True, mlp_bias=True, rope_theta=500.0,
            rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32},
        ),
        # a sliding window on every layer; a head size that is not hidden / heads
        "mistral": lambda: transformers.MistralConfig(**COMMON, sliding_window=WINDOW, head_dim=16),
        # q/k/v biases; the window on the second layer only; YaRN
        "qwen2": lambda: transformers.Qwen2Config(
            **COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
            rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
        ),
        # q/k RMSNorm per head; head size 12 (hidden / heads is 8); tied embeddings; linear RoPE scaling
        "qwen3": lambda: transformers.Qwen3Config(
            **COMMON, head_dim=12, tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0},
        ),
        # Llama with its four multipliers (embeddings, attention, residual, logits)
        "granite": lambda: transformers.GraniteConfig(
            **COMMON, embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0,
        ),
        # (1 + w) norms around attention and MLP, scaled embeddings, query_pre_attn_scalar, a tanh-GELU gate,
        # windowed layers with their own RoPE base around a full one with linear scaling, a soft cap on the logits
        "gemma3": lambda: gemma3_config(),
        # q/k RMSNorm per head after the rotation; attention biases; a dynamic RoPE with an NTK alpha (Hy-MT2's)
        "hunyuan": lambda: transformers.HunYuanDenseV1Config(
            **COMMON, head_dim=8, attention_bias=True,
            rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 100.0},
        ),
        "qwen3_5": lambda: qwen3_5_config(),
        "gemma4": lambda: gemma4_config(),
    }  # fmt: skip
    return configs[family]()


def qwen3_5_config() -> Any:
    """Qwen3.5's text config, tiny: gated delta-rule layers (two key heads serving four value heads, key and value
    sizes apart) around attention layers with RoPE on half of each head and their output gate."""
    import transformers

    return transformers.Qwen3_5TextConfig(
        **COMMON | {"num_hidden_layers": 4}, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5},
    )  # fmt: skip


def qwen3_5_vision_config() -> Any:
    """Qwen3.5 with its vision tower (Qwen3_5Config: Qwen3.5-4B's and TopK-Embed's), the text config above beside a
    one-layer vision tower."""
    import transformers

    vision = transformers.Qwen3_5VisionConfig(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=COMMON["hidden_size"],
        patch_size=14, num_position_embeddings=16,
    )  # fmt: skip
    return transformers.Qwen3_5Config(text_config=qwen3_5_config().to_dict(), vision_config=vision.to_dict())


def qwen3_vl_config() -> Any:
    """Qwen3-VL (Qwen3VLConfig: Qwen3-VL-8B-Instruct's class): a tiny Qwen3 language model (its multimodal RoPE
    sections over the head's 8 pairs) beside a one-layer vision tower with one deepstack layer."""
    import transformers

    text = {**COMMON, "model_type": "qwen3_vl_text", "head_dim": 16, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [4, 2, 2],
                                "mrope_interleaved": True}}  # fmt: skip
    vision = transformers.Qwen3VLVisionConfig(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=COMMON["hidden_size"],
        patch_size=14, num_position_embeddings=16, deepstack_visual_indexes=[0],
    )  # fmt: skip
    return transformers.Qwen3VLConfig(text_config=text, vision_config=vision.to_dict())


def gemma4_config(**options: Any) -> Any:
    """Gemma 4's text config, tiny, as E2B's: windowed layers around full-attention ones with heads twice as wide and
    RoPE on a quarter of them (proportional), the last two layers reading the cache of the last earlier layer of
    their kind with double-wide MLPs, per-layer inputs, a soft cap on the logits; `options` over it."""
    import transformers

    return transformers.Gemma4TextConfig(**COMMON | {
        "num_hidden_layers": 6, "head_dim": 8, "global_head_dim": 16, "sliding_window": WINDOW + 1,
        "layer_types": ["sliding_attention", "full_attention"] * 3, "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": VOCAB,
        "final_logit_softcapping": 5.0,
    } | options)  # fmt: skip


def gemma4_vision_config() -> Any:
    """Gemma 4 with its vision tower (Gemma4Config: gemma-4-E2B-it's class), the text config above with keys as the
    full-attention layers' values (the 31B's) beside a one-layer vision tower."""
    import transformers

    text = gemma4_config(attention_k_eq_v=True, num_global_key_value_heads=1, pad_token_id=END_OF_TEXT)
    vision = transformers.Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, head_dim=8)  # fmt: skip
    return transformers.Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None)


def gemma3_config(bidirectional: bool = False) -> Any:
    """Gemma 3's text config, tiny; `bidirectional` as embeddinggemma's (no logit cap there)."""
    import transformers

    return transformers.Gemma3TextConfig(
        **COMMON | {"num_hidden_layers": 3}, head_dim=12, query_pre_attn_scalar=16, sliding_window=WINDOW + 1,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], rope_theta=10_000.0,
        rope_local_base_freq=100.0, rope_scaling={"rope_type": "linear", "factor": 2.0},
        final_logit_softcapping=None if bidirectional else 5.0, use_bidirectional_attention=bidirectional,
    )  # fmt: skip


def save_gemma3_with_vision(directory: Path, seed: int = 0) -> torch.nn.Module:
    """A Gemma 3 with its vision tower (transformers' Gemma3ForConditionalGeneration, translategemma's class): the tiny
    text config above beside a one-layer SigLIP tower, every parameter moved off its initial value, saved with the
    test tokenizer (transformers writes the Hub's layout: `language_model.model.…`); returns the model (the
    reference)."""
    import torch
    import transformers

    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    config = transformers.Gemma3Config(text_config=gemma3_config().to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4)  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(directory)
    write_tokenizer(directory)
    return model


def random_causal_lm(family: str, seed: int = 0, config: Any = None) -> torch.nn.Module:
    """The family's causal LM (of `config`, else the family's) with every parameter moved well away from its initial
    value (norm scales included), so each tensor the converter reads changes the output."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config or family_config(family)).eval()
    perturb(model)
    return model


def perturb(model: torch.nn.Module) -> None:
    """Every parameter moved well away from its initial value, and Gemma 4's stored layer scalars off 1."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(0.5 + torch.rand_like(buffer))


def write_tokenizer(directory: Path, end_with_eos: bool = False, eos_token: str | None = None) -> Tokenizer:
    """A word-level tokenizer over `<|endoftext|> <|im_start|> <|im_end|> <unk> yes no 1 0 w0 … w55` (the model's
    vocabulary),
    saved as `tokenizer.json` with a `tokenizer_config.json` holding the chat template (and `eos_token`); `end_with_eos`
    appends `<|endoftext|>` to every text, as the Qwen3-Embedding tokenizer does."""
    vocab = {token: index for index, token in enumerate([*SPECIALS, *WORDS])}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(list(SPECIALS))
    if end_with_eos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", END_OF_TEXT)]
        )
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": CHAT_TEMPLATE, "bos_token": None, "eos_token": eos_token, "pad_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tokenizer


def save_causal_lm(directory: Path, family: str, seed: int = 0, **save_options: Any) -> torch.nn.Module:
    """`random_causal_lm` saved with its tokenizer into `directory`; returns the model (the reference)."""
    model = random_causal_lm(family, seed)
    model.save_pretrained(directory, **save_options)
    write_tokenizer(directory)
    return model


def save_base_model(directory: Path, family: str, seed: int = 0, end_with_eos: bool = True) -> torch.nn.Module:
    """The causal LM's bare model (no `model.` prefix, no output head: how embedding models ship) saved with a
    tokenizer that ends every text with `<|endoftext|>` (or, without `end_with_eos`, one that only names it as its
    `eos_token`, as e5-mistral's); returns the bare model (the reference)."""
    base = random_causal_lm(family, seed).model
    base.save_pretrained(directory)
    write_tokenizer(directory, end_with_eos=end_with_eos, eos_token="<|endoftext|>")
    return base


def session(path: Path) -> ort.InferenceSession:
    """A one-thread CPU session of a converted graph."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def reference_logits(model: Any, ids: list[int]) -> np.ndarray:
    """transformers' logits of the last position of `ids`."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()


def run_generation_graph(graph: ort.InferenceSession, shape: CacheShape, prompts: list[list[int]], steps: int):
    """Logits of the last position for a left-padded batch of `prompts`, then `steps` greedy steps through the
    cache; yields (the ids each row has seen, their logits) per run."""
    width = max(map(len, prompts))
    ids = np.zeros((len(prompts), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    cache = empty_cache(shape, len(prompts))
    seen = [list(prompt) for prompt in prompts]
    names = [output.name for output in graph.get_outputs()]
    for _ in range(steps + 1):
        outputs = graph.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **cache})
        logits = outputs[names.index("logits")][:, 0]
        yield [list(row) for row in seen], logits
        chosen = logits.argmax(axis=1)
        for row, token in enumerate(chosen):
            seen[row].append(int(token))
        ids = chosen[:, None].astype(np.int64)
        mask = np.concatenate([mask, np.ones((len(prompts), 1), dtype=np.int64)], axis=1)
        positions = positions[:, -1:] + 1
        cache = next_cache(names, outputs)


def gguf_entry(gguf_path: Path, sie_id: str, precision: str | None = None) -> Any:
    """A catalogue entry serving `gguf_path` for generation under `sie_id`, as the SmolLM2 one does."""
    return parse_model_config(
        {
            "sie_id": sie_id,
            "weights_path": str(gguf_path.parent),
            "tasks": {"generate": {"max_output_tokens": 64}},
            "profiles": {"default": {"adapter_path": "sie.adapters.causal_lm:OnnxCausalLMAdapter",
                                     "max_batch_tokens": 1024, "compute_precision": precision,
                                     "adapter_options": {"loadtime": {"gguf_file": gguf_path.name}}}},
        }
    )  # fmt: skip
