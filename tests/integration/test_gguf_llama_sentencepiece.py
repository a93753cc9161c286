"""Llama 2 and Mistral GGUF files: the `llama` architecture with a SentencePiece vocabulary (`tokenizer.ggml.model =
llama`: pieces, scores and token types, no merges, a space prefix unless the file says otherwise). A SentencePiece BPE
model trained in the test with Llama 2's options (byte fallback, digits split, no normalisation, a dummy prefix; two
control symbols as Mistral's [INST] [/INST]) and a tiny random LlamaForCausalLM over its vocabulary are written as
llama.cpp's converter writes them. The rebuilt tokenizer is checked against `sentencepiece` itself, as llama.cpp
tokenizes: each run of text between special tokens encoded with its own dummy prefix; its vocabulary and merges equal
transformers' GGUF tokenizer's. The converted decoder equals transformers on the original checkpoint, and served
through the model loader it renders the chat template, tokenizes and decodes as sentencepiece does.
"""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from sie.wire.queue import GenerateParams
from sie.worker.convert import ConversionError, convert_gguf
from sie.worker.convert.decoders import DecoderConversion
from sie.worker.generation.kv_cache import CacheShape
from sie.worker.loading import ModelLoader
from support.decoder_checkpoints import (
    gguf_entry,
    random_causal_lm,
    reference_logits,
    run_generation_graph,
    session,
)
from support.llama_reference import add_decoder_numbers, llama_cpp_permute

TOLERANCE = 1e-4
UNK, BOS, EOS = 0, 1, 2
CONTROL_SYMBOLS = ("[INST]", "[/INST]")
SPECIALS = ("<s>", "</s>", *CONTROL_SYMBOLS)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] "
    "+ ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
PASSAGE = (
    "the river rose slowly through the night and by morning the lower fields were under water farmers moved their "
    "animals to the hills while the old stone bridge held against the current hello world there is a question of "
    "time and weather in every story about the sea"
)
TEXTS = [
    "the river rose", "Hello world", "  leading spaces", "trailing spaces   ", "a    b\t\tc\td",
    "line one\nline two\n\n\nend", "Year 2025: 12345 apples!", "café naïve résumé e\u0301", "emoji 😀 and 🤖",
    "中文 text", "[INST] what is the river? [/INST] the river rose</s>", "<s>the<s> </s>[INST][/INST]x", " ", "",
    "unknownword zzzqqq",
]  # fmt: skip


def corpus() -> list[str]:
    """Sentences for the trainer: word runs from a fixed vocabulary, digits, punctuation and a few non-ASCII words."""
    rng = np.random.default_rng(0)
    words = PASSAGE.split()
    lines = [" ".join(rng.choice(words, size=rng.integers(4, 14))) for _ in range(400)]
    extras = ["Year 1999: 42 apples, 7 pears!", "café au lait, naïve résumé", "The River Rose. Hello, World?"]
    return lines + extras * 20


def train_sentencepiece(dummy_prefix: bool = True) -> Any:
    """A SentencePiece BPE model trained with Llama 2's options (its `trainer_spec`), ids 0-2 <unk> <s> </s>;
    `dummy_prefix` is its `add_dummy_prefix` (the "▁" before every text)."""
    import sentencepiece

    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=buffer, model_type="bpe", vocab_size=400,
        hard_vocab_limit=False, byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=dummy_prefix, allow_whitespace_only_pieces=True,
        control_symbols=list(CONTROL_SYMBOLS), unk_id=UNK, bos_id=BOS, eos_id=EOS, pad_id=-1, num_threads=1,
        minloglevel=2,
    )  # fmt: skip
    return sentencepiece.SentencePieceProcessor(model_proto=buffer.getvalue())


@pytest.fixture(scope="module")
def sentencepiece_model() -> Any:
    return train_sentencepiece()


def vocabulary(processor: Any) -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and token types as llama.cpp's `_set_vocab_sentencepiece` reads them from the processor
    (normal 1, unknown 2, control 3, unused 5, byte 6)."""
    ids = range(processor.vocab_size())

    def token_type(index: int) -> int:
        kinds = [(processor.is_unknown, 2), (processor.is_control, 3), (processor.is_unused, 5), (processor.is_byte, 6)]
        return next((kind for check, kind in kinds if check(index)), 1)

    return [processor.id_to_piece(i) for i in ids], [processor.get_score(i) for i in ids], [token_type(i) for i in ids]


def write_llama_gguf(  # noqa: PLR0913 - each keyword is one way a file differs
    model: Any, processor: Any, path: Path, *, scores: bool = True, bos_flag: bool = True, space_prefix: bool = True
) -> Path:
    """`model` with `processor`'s vocabulary as llama.cpp writes a Llama 2 / Mistral file: q/k rows permuted for its
    interleaved RoPE, no `add_space_prefix` key (llama.cpp's default: a prefix; without `space_prefix`, the key
    false), BOS added (without `bos_flag`, no `add_bos_token` key, as older files), the chat template."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    add_decoder_numbers(writer, config)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    tokens, token_scores, token_types = vocabulary(processor)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    if scores:
        writer.add_token_scores(token_scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    if bos_flag:
        writer.add_add_bos_token(True)
    if not space_prefix:
        writer.add_add_space_prefix(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        array = tensor.numpy()
        if name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, config.num_key_value_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def byte_ids(processor: Any) -> list[int]:
    return [index for index in range(processor.vocab_size()) if processor.is_byte(index)]


def llama_cpp_ids(processor: Any, text: str) -> list[int]:
    """llama.cpp's tokenization of `text` (special tokens parsed, no BOS): the special tokens matched whole, and every
    run of text between them encoded by SentencePiece on its own, so each gets the dummy prefix."""
    ids: list[int] = []
    for part in re.split(f"({'|'.join(map(re.escape, SPECIALS))})", text):
        if part in SPECIALS:
            ids.append(processor.piece_to_id(part))
        elif part:
            ids.extend(processor.encode(part))
    return ids


def tiny_llama(processor: Any) -> Any:
    """A random LlamaForCausalLM over `processor`'s vocabulary, which answers greedily in whole pieces (a random run
    of byte tokens is invalid UTF-8, which a stream cannot print as the decode of the whole does)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=processor.vocab_size(), max_position_embeddings=128, bos_token_id=BOS, eos_token_id=EOS,
    )  # fmt: skip
    model = random_causal_lm("llama", config=config)
    with torch.no_grad():
        model.lm_head.weight[byte_ids(processor)] = 0.0
    return model


@pytest.fixture(scope="module")
def tiny(sentencepiece_model: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, DecoderConversion]:
    model = tiny_llama(sentencepiece_model)
    directory = tmp_path_factory.mktemp("llama-sentencepiece")
    path = write_llama_gguf(model, sentencepiece_model, directory / "tiny-llama-spm.gguf")
    return model, convert_gguf(path, directory / "converted")


def rebuilt(converted: DecoderConversion) -> Tokenizer:
    return Tokenizer.from_file(str(converted.directory / "tokenizer.json"))


def test_the_tokenizer_tokenizes_as_llama_cpp_does_with_sentencepiece(
    sentencepiece_model: Any, tiny: tuple[Any, DecoderConversion]
) -> None:
    ours = rebuilt(tiny[1])
    assert sentencepiece_model.vocab_size() > 300 and sentencepiece_model.piece_to_id("[INST]") == 3
    for text in TEXTS:
        expected = llama_cpp_ids(sentencepiece_model, text)
        assert ours.encode(text).ids == [BOS, *expected], text
        assert ours.encode(text, add_special_tokens=False).ids == expected, text
        if not any(special in text for special in SPECIALS):  # one SentencePiece run: its decode is the reference
            assert ours.decode(expected) == sentencepiece_model.decode(expected) == text, text
    assert ours.encode("a😀", add_special_tokens=False).tokens[-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    # after a special token the text gets its own "▁", as llama.cpp prefixes it (transformers' GGUF tokenizer does
    # not: its prefix goes to the first run only)
    assert ours.encode("[INST]hello", add_special_tokens=False).tokens[:2] == ["[INST]", "▁hello"]
    assert ours.decode(ours.encode("[INST] hi [/INST]").ids, skip_special_tokens=True) == " hi "


def test_vocabulary_and_merges_equal_transformers_gguf_tokenizer(tiny: tuple[Any, DecoderConversion]) -> None:
    import json

    from transformers import AutoTokenizer

    _, converted = tiny
    gguf_path = converted.directory.parent / "tiny-llama-spm.gguf"
    reference = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    ours = rebuilt(converted)
    ours_model, theirs_model = (json.loads(t.to_str())["model"] for t in (ours, reference.backend_tokenizer))
    assert ours_model["vocab"] == theirs_model["vocab"] and ours_model["merges"] == theirs_model["merges"]
    # the same ids on one run of text, but where it starts with a space: transformers' prefix (`Metaspace`) is not
    # added to a text that already starts with "▁", where SentencePiece and llama.cpp add it to every text
    for text in TEXTS:
        if not any(special in text for special in SPECIALS) and not text.startswith(" "):
            assert ours.encode(text).ids == reference(text)["input_ids"], text
    ours_spaces, theirs_spaces = ours.encode("  the", add_special_tokens=False).tokens, reference.tokenize("  the")
    assert ours_spaces == ["▁", "▁", "▁the"] and theirs_spaces == ["▁", "▁the"]


def test_the_decoder_equals_transformers_on_the_original_checkpoint(tiny: tuple[Any, DecoderConversion]) -> None:
    import json

    model, converted = tiny
    config = json.loads((converted.directory / "config.json").read_text())
    assert (config["model_type"], config["bos_token_id"], config["eos_token_id"]) == ("llama", BOS, EOS)
    prompts = [[BOS, 40, 41, 42, 300, 7], [BOS, 99], [BOS, *range(200, 212)]]
    runs = 0
    for seen, logits in run_generation_graph(session(converted.graph), CacheShape.from_config(config), prompts, 3):
        for row, ids in enumerate(seen):
            assert float(np.abs(logits[row] - reference_logits(model, ids)).max()) <= TOLERANCE, ids
        runs += 1
    assert runs == 4


async def test_the_loader_serves_the_gguf_with_sentencepiece_text(
    sentencepiece_model: Any, tiny: tuple[Any, DecoderConversion], model_loader: ModelLoader
) -> None:
    """The served path: the chat template rendered and tokenized as llama.cpp does, transformers' greedy tokens
    generated, the streamed text equal to sentencepiece's decode of them."""
    import torch

    model, converted = tiny
    gguf_path = converted.directory.parent / "tiny-llama-spm.gguf"
    entry = gguf_entry(gguf_path, "acme/tiny-llama-spm-gguf")
    loaded = model_loader.load(entry, "default", entry.sie_id)
    try:
        adapter = loaded.adapter
        params = GenerateParams(messages=[{"role": "user", "content": "where is the river?"}], max_new_tokens=10,
                                temperature=0.0)  # fmt: skip
        prepared = await asyncio.to_thread(adapter.prepare, params)
        rendered = "[INST] where is the river? [/INST]"
        assert list(prepared.prompt_ids) == [BOS, *llama_cpp_ids(sentencepiece_model, rendered)]
        raw = await asyncio.to_thread(adapter.prepare, GenerateParams(prompt="hello world", max_new_tokens=4))
        assert list(raw.prompt_ids) == [BOS, *sentencepiece_model.encode("hello world")]
        stream = adapter.start(prepared, "r0", "s0")
        texts = []
        while not (event := await stream.next()).done:
            texts.append(event.text)
        with torch.no_grad():
            out = model.generate(torch.tensor([list(prepared.prompt_ids)]), max_new_tokens=10, do_sample=False,
                                 eos_token_id=EOS, pad_token_id=EOS)  # fmt: skip
        generated = [token for token in out[0, len(prepared.prompt_ids) :].tolist() if token != EOS]
        assert len(generated) == 10  # no <eos> within the 10 tokens: the whole answer is compared
        assert "".join(texts) + event.text == sentencepiece_model.decode(generated)
    finally:
        loaded.close()


def test_a_sentencepiece_file_without_scores_is_a_conversion_error(
    sentencepiece_model: Any, tiny: tuple[Any, DecoderConversion], tmp_path: Path
) -> None:
    path = write_llama_gguf(tiny[0], sentencepiece_model, tmp_path / "no-scores.gguf", scores=False)
    with pytest.raises(ConversionError, match="needs as many scores, found none"):
        convert_gguf(path, tmp_path / "out")


def test_a_file_without_a_bos_flag_adds_bos_as_llama_cpp_does(
    sentencepiece_model: Any, tiny: tuple[Any, DecoderConversion], tmp_path: Path
) -> None:
    path = write_llama_gguf(tiny[0], sentencepiece_model, tmp_path / "no-flag.gguf", bos_flag=False)
    converted = convert_gguf(path, tmp_path / "out")
    assert rebuilt(converted).encode("hello world").ids == [BOS, *sentencepiece_model.encode("hello world")]


def test_a_file_without_a_space_prefix_tokenizes_as_sentencepiece_without_its_dummy_prefix(tmp_path: Path) -> None:
    processor = train_sentencepiece(dummy_prefix=False)
    path = write_llama_gguf(tiny_llama(processor), processor, tmp_path / "no-prefix.gguf", space_prefix=False)
    ours = rebuilt(convert_gguf(path, tmp_path / "out"))
    for text in TEXTS:
        expected = llama_cpp_ids(processor, text)
        assert ours.encode(text, add_special_tokens=False).ids == expected, text
        if not any(special in text for special in SPECIALS):
            assert ours.decode(expected) == processor.decode(expected) == text, text
    assert ours.encode("the river", add_special_tokens=False).tokens[0] != "▁the"  # no "▁" before the first word
