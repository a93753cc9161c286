"""The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`), rebuilt as a
`tokenizers` Tokenizer (saved as tokenizer.json) plus the Hugging Face style tokenizer_config.json that names the
special tokens and keeps the chat template for the causal-LM adapter.

Two kinds are rebuilt: GPT-2 style byte-level BPE (`tokenizer.ggml.model = gpt2`), with the pre-tokenizers whose
splitting rules `tokenizers` spells exactly (GPT-2's, StarCoder's digits first, Qwen2's, Llama 3's, Tekken's), and the
SentencePiece vocabularies of Gemma 3 and of the llama architecture (Llama 2, Mistral: `llama`,
`gguf_sentencepiece`); anything else is a ConversionError, never an approximate tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import attrs
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.gguf_io import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, GgufFile
from sie.worker.convert.gguf_sentencepiece import (
    SentencePieceShape,
    sentencepiece_model,
    sentencepiece_shape,
    sentencepiece_vocabulary,
)
from sie.worker.convert.names import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

TOKENIZER_MODELS: Final = ("gpt2", "llama")  # `tokenizer.ggml.model`: byte-level BPE, SentencePiece
# llama.cpp pre-tokenizer names (`tokenizer.ggml.pre`) whose split is GPT-2's regex, with digits first split one by
# one for the StarCoder family (SmolLM's tokenizer.json: Digits(individual_digits) then ByteLevel).
_GPT2_PRE: Final = frozenset({"default", "gpt-2", "gpt2"})
_DIGITS_THEN_GPT2_PRE: Final = frozenset({"smollm", "starcoder", "refact", "codeshell"})
# Qwen2's split (its tokenizer.json): GPT-4's regex with digits one by one, after NFC normalisation.
QWEN2_PATTERN: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama 3's split (its tokenizer.json; llama.cpp's `llama-bpe`): GPT-4's regex with digits in runs of up to three.
LLAMA3_PATTERN: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_LLAMA3_PRE: Final = frozenset({"llama-bpe", "llama3", "llama-v3"})
# Mistral's Tekken split (tekken.json; Mistral NeMo, Ministral): words by letter case, digits one by one.
TEKKEN_PATTERN: Final = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPECIAL_ROLES: Final = ("bos", "eos", "unknown", "padding")
# Tokens llama.cpp ends a generation at besides <eos> (its end-of-generation set, found by their text): the end of a
# turn or a message in the chat formats (Llama 3, ChatML, Phi, Gemma, …), the end of text where <eos> is another.
END_OF_GENERATION_TOKENS: Final = frozenset({
    "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "<end_of_utterance>",
})  # fmt: skip


@attrs.frozen
class GgufTokenizer:
    """The rebuilt tokenizer and what the adapter needs beside it: special tokens and the chat template."""

    tokenizer: Tokenizer
    special_tokens: dict[str, str]  # role (bos, eos, unk, pad) -> token text
    special_ids: dict[str, int | list[int]]  # `bos_token_id`, `eos_token_id`, ... as config.json names them
    chat_template: str | None
    add_bos_token: bool
    model_max_length: int

    def tokenizer_config(self) -> dict[str, Any]:
        """tokenizer_config.json in Hugging Face names (`chat_template` is a Jinja template string)."""
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos_token,
            "clean_up_tokenization_spaces": False,
            "model_max_length": self.model_max_length,
            **{f"{role}_token": token for role, token in self.special_tokens.items()},
            "chat_template": self.chat_template,
        }

    def save(self, directory: Path) -> None:
        """Write tokenizer.json and tokenizer_config.json into `directory`."""
        directory = Path(directory)
        try:
            self.tokenizer.save(str(directory / TOKENIZER_FILE))
            config = json.dumps(self.tokenizer_config(), indent=2, ensure_ascii=False)
            (directory / TOKENIZER_CONFIG_FILE).write_text(config + "\n", encoding="utf-8")
        except OSError as exc:
            raise ConversionError(f"cannot write the tokenizer: {exc}", source=str(directory)) from exc


def gguf_tokenizer(gguf: GgufFile, model_max_length: int) -> GgufTokenizer:
    """Rebuild the tokenizer of `gguf` from its vocabulary, merges (or, for SentencePiece, its token order), token
    types and special ids."""
    source = str(gguf.path)
    kind = gguf.value("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        raise ConversionError(f"tokenizer model {kind!r} is not supported; expected byte-level BPE 'gpt2' or "
                              f"SentencePiece 'llama'", source=source)  # fmt: skip
    tokens = [str(token) for token in gguf.value("tokenizer.ggml.tokens")]
    token_types = list(gguf.value("tokenizer.ggml.token_type", [1] * len(tokens)))
    if len(token_types) != len(tokens):
        raise ConversionError(f"{len(token_types)} token types for {len(tokens)} tokens", source=source)
    shape = sentencepiece_shape(gguf) if kind == "llama" else None
    if shape is not None:
        tokens, token_types = sentencepiece_vocabulary(tokens, token_types)
    if len(set(tokens)) != len(tokens):
        raise ConversionError("the vocabulary repeats a token", source=source)
    special_ids = {role: gguf.value(f"tokenizer.ggml.{role}_token_id", None) for role in _SPECIAL_ROLES}
    unknown = tokens[special_ids["unknown"]] if _valid_id(special_ids["unknown"], tokens) else None
    if shape is not None:
        tokenizer, fallback = sentencepiece_model(tokens, _scores(gguf, len(tokens), shape), unknown, shape), None
    else:
        tokenizer, fallback = _byte_level_model(gguf, tokens, unknown), processors.ByteLevel(trim_offsets=False)
    # llama.cpp adds BOS to a SentencePiece text unless the file says not to (older Llama 2 files have no flag)
    add_bos = bool(gguf.value("tokenizer.ggml.add_bos_token", shape is not None))
    post_processor = _bos_template(add_bos, special_ids["bos"], tokens) or fallback
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    tokenizer.add_tokens(_added_tokens(tokens, token_types, TOKEN_TYPE_USER_DEFINED, special=False))
    tokenizer.add_special_tokens(_added_tokens(tokens, token_types, TOKEN_TYPE_CONTROL, special=True))
    names = {"bos": "bos", "eos": "eos", "unknown": "unk", "padding": "pad"}
    ids: dict[str, int | list[int]] = {
        f"{names[role]}_token_id": i for role, i in special_ids.items() if _valid_id(i, tokens)
    }
    ends = _end_of_generation_ids(gguf, tokens, token_types)
    eos = ids.get("eos_token_id")
    if ends - {eos}:  # a list, as config.json lists every id that ends a generation
        ids["eos_token_id"] = sorted(ends | ({eos} if isinstance(eos, int) else set()))
    return GgufTokenizer(
        tokenizer=tokenizer,
        special_tokens={names[role]: tokens[i] for role, i in special_ids.items() if _valid_id(i, tokens)},
        special_ids=ids,
        chat_template=gguf.value("tokenizer.chat_template", None),
        add_bos_token=add_bos,
        model_max_length=model_max_length,
    )


def _end_of_generation_ids(gguf: GgufFile, tokens: list[str], token_types: list[int]) -> set[int]:
    """The ids llama.cpp ends a generation at besides <eos>: the end-of-turn markers it finds by their text among
    the special and added tokens, and the end-of-turn / end-of-message ids the file names."""
    found = {
        index
        for index, (token, token_type) in enumerate(zip(tokens, token_types, strict=True))
        if token in END_OF_GENERATION_TOKENS and token_type in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    }
    named = (gguf.value(f"tokenizer.ggml.{role}_token_id", None) for role in ("eot", "eom"))
    return found | {token_id for token_id in named if _valid_id(token_id, tokens)}


def _byte_level_model(gguf: GgufFile, tokens: list[str], unknown: str | None) -> Tokenizer:
    """The byte-level BPE model with its file's merges and the pre-tokenizer `tokenizer.ggml.pre` names."""
    source = str(gguf.path)
    merges = [_merge_pair(str(merge), source) for merge in gguf.value("tokenizer.ggml.merges")]
    bpe = models.BPE(
        vocab={token: index for index, token in enumerate(tokens)},
        merges=merges,
        unk_token=unknown,
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    pre = str(gguf.value("tokenizer.ggml.pre", "default"))
    if pre == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer(pre, source)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _scores(gguf: GgufFile, count: int, shape: SentencePieceShape) -> list[float] | None:
    """The pieces' scores, where the shape ranks its merges by them."""
    if not shape.merges_by_score:
        return None
    scores = gguf.value("tokenizer.ggml.scores", None)
    if scores is None or len(scores) != count:
        found = "none" if scores is None else len(scores)
        raise ConversionError(f"a SentencePiece vocabulary of {count} tokens needs as many scores, found {found}",
                              source=str(gguf.path))  # fmt: skip
    return [float(score) for score in scores]


def _valid_id(token_id: Any, tokens: list[str]) -> bool:
    return isinstance(token_id, int) and 0 <= token_id < len(tokens)


def _merge_pair(merge: str, source: str) -> tuple[str, str]:
    # Byte-level tokens never hold a plain space (it is mapped to "Ġ"), so one space separates the pair.
    left, space, right = merge.partition(" ")
    if not space or not left or not right or " " in right:
        raise ConversionError(f"malformed merge {merge!r}", source=source)
    return left, right


def _pre_tokenizer(name: str, source: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in _GPT2_PRE:
        return byte_level
    if name in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    patterns = {"qwen2": QWEN2_PATTERN, "tekken": TEKKEN_PATTERN} | dict.fromkeys(_LLAMA3_PRE, LLAMA3_PATTERN)
    if name in patterns:
        split = pre_tokenizers.Split(Regex(patterns[name]), behavior="isolated", invert=False)
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    known = sorted(_GPT2_PRE | _DIGITS_THEN_GPT2_PRE | _LLAMA3_PRE | {"qwen2", "tekken"})
    raise ConversionError(f"pre-tokenizer {name!r} is not supported; known: {known}", source=source)


def _bos_template(add_bos: bool, bos_id: Any, tokens: list[str]) -> processors.PostProcessor | None:
    if add_bos and _valid_id(bos_id, tokens):
        bos = tokens[bos_id]
        return processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return None


def _added_tokens(tokens: list[str], token_types: list[int], wanted: int, *, special: bool) -> list[AddedToken]:
    return [
        AddedToken(token, special=special, normalized=False)
        for token, token_type in zip(tokens, token_types, strict=True)
        if token_type == wanted
    ]
