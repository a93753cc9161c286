"""The GGUF→ONNX decoder converter against a numpy llama on small random weights: logits of a left-padded batch,
the same logits token by token through the key/value cache, in float32 and float16; its tokenizer, config and
errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from sie.worker.convert import (
    CONFIG_FILE,
    GRAPH_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    ConversionError,
    convert_gguf,
    gguf_cache_key,
)
from sie.worker.convert.gguf_decoders import unpermute_rows
from sie.worker.generation.greedy_loop import greedy_decode
from sie.worker.generation.kv_cache import CacheShape, empty_cache, next_cache
from support.llama_reference import (
    CHAT_TEMPLATE,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    VOCAB,
    TinyLlama,
    llama_cpp_permute,
    random_llama,
    reference_logits,
    write_gguf,
)

TOLERANCE = {"float32": 2e-4, "float16": 3e-2}


@pytest.fixture(scope="module")
def model() -> TinyLlama:
    return random_llama()


@pytest.fixture(scope="module")
def gguf_path(model: TinyLlama, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module", params=["float32", "float16"])
def converted(request: pytest.FixtureRequest, gguf_path: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp(f"decoder-{request.param}")
    result = convert_gguf(gguf_path, out, request.param)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(result.graph), options, providers=["CPUExecutionProvider"])
    return result, session


def left_padded(rng: np.random.Generator, lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    width = max(lengths)
    ids = rng.integers(3, VOCAB, size=(len(lengths), width))
    mask = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return ids, mask


def run(session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, cache: dict):
    names = [output.name for output in session.get_outputs()]
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **cache}
    outputs = session.run(None, feeds)
    return outputs[names.index("logits")], next_cache(names, outputs)


def test_unpermute_undoes_llama_cpp_permutation() -> None:
    weight = np.arange(HEADS * HEAD_DIM * 3, dtype=np.float32).reshape(HEADS * HEAD_DIM, 3)
    assert np.array_equal(unpermute_rows(llama_cpp_permute(weight, HEADS), HEADS), weight)
    assert not np.array_equal(llama_cpp_permute(weight, HEADS), weight)


def test_a_left_padded_prefill_matches_the_reference(model: TinyLlama, converted) -> None:
    result, session = converted
    ids, mask = left_padded(np.random.default_rng(5), [7, 4, 1])
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    shape = CacheShape(LAYERS, KV_HEADS, HEAD_DIM, np.float16 if result.precision == "float16" else np.float32)
    logits, cache = run(session, ids, mask, positions, empty_cache(shape, batch=3))
    expected = reference_logits(model, ids, mask)
    assert logits.dtype == np.float32 and logits.shape == (3, 1, VOCAB)  # the last position's only
    np.testing.assert_allclose(logits, expected[:, -1:], atol=TOLERANCE[result.precision], rtol=0)
    # Padded query rows see no key: a uniform softmax, not NaN, so the cache they leave is finite too.
    assert np.isfinite(logits).all() and all(np.isfinite(value).all() for value in cache.values())
    assert cache["past_key_values.0.key"].shape == (3, KV_HEADS, 7, HEAD_DIM)


def test_decoding_through_the_cache_matches_the_whole_sequence(model: TinyLlama, converted) -> None:
    """Prefill 3 tokens, then feed 4 more one by one (left-padded rows too): each step's logits equal the
    reference's at that position of the full sequence."""
    result, session = converted
    ids, mask = left_padded(np.random.default_rng(11), [7, 5])
    expected = reference_logits(model, ids, mask)
    shape = CacheShape(LAYERS, KV_HEADS, HEAD_DIM, np.float16 if result.precision == "float16" else np.float32)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, cache = run(session, ids[:, :3], mask[:, :3], positions[:, :3], empty_cache(shape, batch=2))
    steps = [logits[:, -1]]
    for index in range(3, 7):
        logits, cache = run(
            session, ids[:, index : index + 1], mask[:, : index + 1], positions[:, index : index + 1], cache
        )
        steps.append(logits[:, -1])
    np.testing.assert_allclose(np.stack(steps, axis=1), expected[:, 2:], atol=TOLERANCE[result.precision], rtol=0)


def test_greedy_decode_follows_the_reference_argmax(model: TinyLlama, gguf_path: Path, tmp_path: Path) -> None:
    result = convert_gguf(gguf_path, tmp_path / "decoder")
    session = ort.InferenceSession(str(result.graph), providers=["CPUExecutionProvider"])
    config = json.loads((result.directory / CONFIG_FILE).read_text())
    prompt = [1, 40, 41, 42]
    decoded = greedy_decode(session, prompt, CacheShape.from_config(config), max_new_tokens=5, stop_ids=())
    sequence = list(prompt)
    for _ in range(5):
        logits = reference_logits(model, np.asarray([sequence]), np.ones((1, len(sequence)), dtype=np.int64))
        sequence.append(int(logits[0, -1].argmax()))
    assert list(decoded.token_ids) == sequence[len(prompt) :]
    assert decoded.finish_reason == "length"
    stop = decoded.token_ids[-1]
    stopped = greedy_decode(session, prompt, CacheShape.from_config(config), 5, stop_ids={stop})
    assert stopped.token_ids == decoded.token_ids[: decoded.token_ids.index(stop)]
    assert stopped.finish_reason == "stop"


def test_the_directory_holds_tokenizer_and_config(converted) -> None:
    result, _ = converted
    assert sorted(path.name for path in result.directory.iterdir()) == sorted(
        [GRAPH_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CONFIG_FILE]
    )
    config = json.loads((result.directory / CONFIG_FILE).read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (
        LAYERS,
        KV_HEADS,
        HEAD_DIM,
    )
    # <|im_end|> is the file's <eos>; <|endoftext|> ends a generation too, as llama.cpp's end-of-generation set has it
    assert (config["eos_token_id"], config["bos_token_id"], config["torch_dtype"]) == ([0, 2], 1, result.precision)
    tokenizer_config = json.loads((result.directory / TOKENIZER_CONFIG_FILE).read_text())
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert (tokenizer_config["eos_token"], tokenizer_config["bos_token"]) == ("<|im_end|>", "<|im_start|>")
    tokenizer = Tokenizer.from_file(str(result.directory / TOKENIZER_FILE))
    text = "<|im_start|>user the tin 42<|im_end|>"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == 1 and encoding.ids[-1] == 2
    assert "Ġthe" in encoding.tokens and "in" in encoding.tokens  # merges applied
    assert encoding.tokens[-3:-1] == ["4", "2"]  # digits split one by one
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == text
    assert tokenizer.decode(encoding.ids) == "user the tin 42"


def test_the_cache_key_follows_content_and_precision(gguf_path: Path, tmp_path: Path) -> None:
    key = gguf_cache_key(gguf_path, "float32")
    assert key == gguf_cache_key(gguf_path, "float32") != gguf_cache_key(gguf_path, "float16")
    changed = tmp_path / "changed.gguf"
    changed.write_bytes(gguf_path.read_bytes()[:-1] + b"\x01")
    assert gguf_cache_key(changed, "float32") != key


def test_unconvertible_files_raise_conversion_errors(model: TinyLlama, tmp_path: Path) -> None:
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConversionError, match="not a readable GGUF file"):
        convert_gguf(not_gguf, tmp_path / "out1")
    other = write_gguf(model, tmp_path / "gemma.gguf", architecture="gemma")
    with pytest.raises(ConversionError, match="architecture 'gemma' is not supported"):
        convert_gguf(other, tmp_path / "out2")
    other_split = write_gguf(model, tmp_path / "deepseek.gguf", pre="deepseek-coder")
    with pytest.raises(ConversionError, match="pre-tokenizer 'deepseek-coder' is not supported"):
        convert_gguf(other_split, tmp_path / "out3")
    with pytest.raises(ConversionError, match="unknown precision"):
        convert_gguf(gguf_path_of(tmp_path, model), tmp_path / "out4", "int4")
    whole = gguf_path_of(tmp_path, model).read_bytes()
    for cut in (30, len(whole) // 3, len(whole) - 16):  # in the metadata, then short of the tensor data
        truncated = tmp_path / f"cut-{cut}.gguf"
        truncated.write_bytes(whole[:cut])
        with pytest.raises(ConversionError, match="not a readable GGUF file"):
            convert_gguf(truncated, tmp_path / f"out-cut-{cut}")


def gguf_path_of(tmp_path: Path, model: TinyLlama) -> Path:
    return write_gguf(model, tmp_path / "plain.gguf")


def test_the_end_of_turn_id_a_file_names_ends_a_generation_too(model: TinyLlama, tmp_path: Path) -> None:
    result = convert_gguf(write_gguf(model, tmp_path / "eot.gguf", eot=1), tmp_path / "out")
    config = json.loads((result.directory / CONFIG_FILE).read_text())
    assert config["eos_token_id"] == [0, 1, 2]  # <|endoftext|> by its text, <|im_start|> named, <|im_end|> the <eos>
