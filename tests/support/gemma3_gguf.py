"""A tiny Gemma 3 written as a GGUF file the way llama.cpp's convert_hf_to_gguf writes one: the architecture numbers
under `gemma3.*` (not what llama.cpp hard-codes: the layer pattern, the sliding layers' RoPE base, the query scale),
tensors under the `gguf` package's own name table with every norm stored as 1 + weight and the embedding unscaled, and
a small SentencePiece vocabulary in Gemma's layout: control tokens, user-defined ones (newline runs, and runs of
spaces spelled with real spaces, as llama.cpp writes them), the 256 byte tokens, then pieces best first, with scores
that do not follow that order (Gemma's do not). torch and transformers are imported when a model is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from support.llama_reference import add_decoder_numbers

CONTROL = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>")
PAD, EOS, BOS, UNK, END_OF_TURN = 0, 1, 2, 3, 6
USER_DEFINED = ("[multimodal]", "\n", "\n\n", "\t\t", "  ", "   ", "    ")
BYTES = tuple(f"<0x{byte:02X}>" for byte in range(256))
PIECES = (
    "▁", *"etaoinshrldcumwfgypbvkTHWIAS", *"0123456789", *".,!?:;-'()", "é",
    "▁t", "he", "▁the", "in", "▁a", "er", "on", "▁w", "or", "▁s", "ll", "▁he", "ld", "is", "▁is", "en", "an",
    "at", "▁th", "nd", "▁and", "▁wor", "▁world", "▁hell", "▁hello", "▁T", "▁The", "ing", "▁in", "▁of", "▁to",
    "es", "▁c", "ion", "▁b", "it", "ar", "▁f", "ou", "▁y", "▁you", "▁m", "al", "re", "▁re",
)  # fmt: skip
TYPES = {3: CONTROL, 4: USER_DEFINED, 6: BYTES, 1: PIECES}
SLIDING_WINDOW = 4  # tokens: shorter than the test prompts
LAYERS = 7  # llama.cpp's gemma3 pattern: layers 0-4 sliding, 5 global, 6 sliding
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] "
    "+ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def vocabulary() -> tuple[list[str], list[int]]:
    """The tokens in file order and their llama.cpp token types."""
    tokens = [*CONTROL, *USER_DEFINED, *BYTES, *PIECES]
    kinds = {token: kind for kind, group in TYPES.items() for token in group}
    return tokens, [kinds[token] for token in tokens]


VOCAB = len(vocabulary()[0])
BYTE_IDS = slice(len(CONTROL) + len(USER_DEFINED), len(CONTROL) + len(USER_DEFINED) + len(BYTES))


def layer_types() -> list[str]:
    return ["full_attention" if index % 6 == 5 else "sliding_attention" for index in range(LAYERS)]


def gemma3_config(rope_scaling: float | None = None, softcap: float | None = None) -> Any:
    """A tiny Gemma3TextConfig with what llama.cpp assumes for a `gemma3` file (query scale 1/sqrt(head_dim), the
    sliding layers' RoPE base 10000, a global layer every sixth); optionally linear RoPE scaling on the global layers
    and a final logit soft cap, which a GGUF states."""
    import transformers

    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
        layer_types=layer_types(), rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": rope_scaling} if rope_scaling else None,
        final_logit_softcapping=softcap, max_position_embeddings=128, rms_norm_eps=1e-6,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True,
    )  # fmt: skip


def write_gemma3_gguf(  # noqa: PLR0913 - each keyword is one way a file differs
    state: Mapping[str, Any],
    config: Any,
    path: Path,
    *,
    extra_metadata: Mapping[str, Any] | None = None,
    extra_tensors: Mapping[str, np.ndarray] | None = None,
    space_prefix: bool = False,
) -> Path:
    """`state` (a Gemma3ForCausalLM's state dict, tensors or arrays) and `config` as llama.cpp's converter writes
    them; `extra_metadata` ({key: (value, gguf.GGUFValueType)}) and `extra_tensors` make files it cannot convert."""
    writer = gguf.GGUFWriter(str(path), "gemma3")
    add_decoder_numbers(writer, config)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_parameters["full_attention"]["rope_theta"])
    scaling = config.rope_parameters["full_attention"]
    if scaling.get("rope_type", "default") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    if config.final_logit_softcapping:
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    writer.add_sliding_window(config.sliding_window)
    _write_vocabulary(writer, space_prefix)
    for key, (value, value_type) in (extra_metadata or {}).items():
        writer.add_key_value(key, value, value_type)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, config.num_hidden_layers)
    for name, tensor in state.items():
        if name == "lm_head.weight":  # tied to the embedding; llama.cpp's converter skips it
            continue
        array = np.asarray(tensor, dtype=np.float32)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), array + 1 if name.endswith("norm.weight")
                          else array)  # fmt: skip
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_vocabulary(writer: gguf.GGUFWriter, space_prefix: bool) -> None:
    tokens, types = vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(score) for score in np.random.default_rng(0).permutation(len(tokens))])
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_pad_token_id(PAD)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(space_prefix)
    writer.add_chat_template(CHAT_TEMPLATE)
