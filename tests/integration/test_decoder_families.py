"""The decoder families (Llama, Mistral, Qwen2, Qwen3) from transformers checkpoints against transformers on the same
tiny random checkpoints: the generation graph's logits on a left-padded batch and step by step through its key/value
cache, the hidden-state graph, greedy generation of 32 tokens through the model loader and the continuous-batching
engine (alone and four prompts of different lengths together), embeddings through the public catalogue's decoder
embedding modules, sharded and GGUF checkpoints of the same weights, and the load errors of what is not built."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer

from sie.catalog import load_yaml, parse_model_config
from sie.wire.ipc_batch import EncodeBatchItem
from sie.wire.queue import GenerateParams
from sie.worker.convert import convert_decoder_checkpoint, convert_decoder_hidden, convert_gguf
from sie.worker.convert.cache_keys import decoder_cache_key
from sie.worker.convert.errors import ConversionError
from sie.worker.errors import ModelLoadError
from sie.worker.generation.kv_cache import CacheShape
from sie.worker.loading import ModelLoader, graph_bytes
from sie.worker.session import SessionOptions
from support import llama_reference, qwen3_vl_recipes
from support.decoder_checkpoints import (
    CHAT_TEMPLATE,
    COMMON,
    FAMILIES,
    IM_END,
    VOCAB,
    family_config,
    gemma3_config,
    random_causal_lm,
    reference_logits,
    run_generation_graph,
    save_base_model,
    save_causal_lm,
    save_gemma3_with_vision,
    session,
    write_tokenizer,
)
from support.worker_items import encode_items

TOLERANCE = 1e-4
LENGTHS = [7, 3, 5]  # left-padded to 7: longer than the sliding window


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    directory = tmp_path_factory.mktemp(request.param)
    return request.param, directory, save_causal_lm(directory, request.param)


def test_the_generation_graph_equals_transformers(checkpoint, tmp_path: Path) -> None:
    family, directory, model = checkpoint
    converted = convert_decoder_checkpoint(directory, tmp_path / "decoder")
    config = json.loads((converted.directory / "config.json").read_text())
    rng = np.random.default_rng(1)
    prompts = [rng.integers(4, VOCAB, size=length).tolist() for length in LENGTHS]
    runs = 0
    for seen, logits in run_generation_graph(session(converted.graph), CacheShape.from_config(config), prompts, 4):
        for row, ids in enumerate(seen):
            assert float(np.abs(logits[row] - reference_logits(model, ids)).max()) <= TOLERANCE, (family, ids)
        runs += 1
    assert runs == 5
    reference = family_config(family)
    head_dim = reference.to_dict().get("head_dim") or reference.hidden_size // reference.num_attention_heads
    model_type = {"gemma3": "gemma3_text", "hunyuan": "hunyuan_v1_dense", "qwen3_5": "qwen3_5_text",
                  "gemma4": "gemma4_text"}.get(family, family)  # fmt: skip
    assert (config["model_type"], config["sie_graph"], config["head_dim"]) == (model_type, "generate", head_dim)


@pytest.fixture(scope="module")
def gemma3_with_vision(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    directory = tmp_path_factory.mktemp("gemma3-vision")
    return directory, save_gemma3_with_vision(directory)


def inner_name(name: str) -> str:
    """A tensor's name in transformers' in-memory layout of Gemma3ForConditionalGeneration."""
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    if name.startswith("language_model."):  # its lm_head, when untied
        return name.removeprefix("language_model.")
    return "model." + name  # the vision tower and its projector


@pytest.mark.parametrize("layout", ["hub", "inner"])
def test_a_gemma3_with_a_vision_tower_converts_its_language_model(
    gemma3_with_vision: tuple[Path, Any], layout: str, tmp_path: Path
) -> None:
    """translategemma's class: the language model of a Gemma3ForConditionalGeneration checkpoint (config `gemma3`,
    `text_config`) equals transformers' whole model on text, in the layout transformers saves (the Hub's:
    `language_model.model.…`) and in its in-memory one (`model.language_model.…`, `lm_head` at the top)."""
    from safetensors.numpy import load_file, save_file

    directory, model = gemma3_with_vision
    if layout == "inner":
        tensors = load_file(directory / "model.safetensors")
        renamed = {inner_name(name): value for name, value in tensors.items()}
        assert "model.language_model.embed_tokens.weight" in renamed
        copy = tmp_path / "inner"
        copy.mkdir()
        for file in directory.iterdir():
            if file.name != "model.safetensors":
                (copy / file.name).write_bytes(file.read_bytes())
        save_file(renamed, copy / "model.safetensors", metadata={"format": "pt"})
        directory = copy
    converted = convert_decoder_checkpoint(directory, tmp_path / "decoder")
    config = json.loads((converted.directory / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    rng = np.random.default_rng(3)
    prompts = [rng.integers(4, VOCAB, size=length).tolist() for length in LENGTHS]
    for seen, logits in run_generation_graph(session(converted.graph), CacheShape.from_config(config), prompts, 2):
        for row, ids in enumerate(seen):
            assert float(np.abs(logits[row] - reference_logits(model, ids)).max()) <= TOLERANCE, ids


async def test_a_gemma3_with_a_vision_tower_generates_as_transformers(
    gemma3_with_vision: tuple[Path, Any], model_loader: ModelLoader
) -> None:
    """Through the model loader (what `sie run` does with translategemma's YAML): greedy text equals transformers'."""
    import torch

    directory, model = gemma3_with_vision
    loaded = model_loader.load(generation_yaml(directory, "gemma3"), "default", "acme/gemma3-chat")
    try:
        prompt = "w1 w2 w3 w4"
        ids = loaded.tokenizer.encode_batch([prompt])[0].input_ids.tolist()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                 pad_token_id=0)  # fmt: skip
        expected = loaded.adapter.decode_text(out[0, len(ids) :].tolist())
        request = GenerateParams(prompt=prompt, max_new_tokens=16, temperature=0.0)
        assert await generate_all(loaded.adapter, [request]) == [expected]
    finally:
        loaded.close()


# Vision-language checkpoints whose language model converts, for text: the transformers class and config builder, and
# the decoder family it converts as.
WITH_VISION = {"qwen3_5": ("Qwen3_5ForConditionalGeneration", "qwen3_5_vision_config", "qwen3_5_text"),
               "qwen3_vl": ("Qwen3VLForConditionalGeneration", "qwen3_vl_config", "qwen3"),
               "gemma4": ("Gemma4ForConditionalGeneration", "gemma4_vision_config", "gemma4_text")}  # fmt: skip


@pytest.fixture(scope="module")
def with_vision(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Any]]:
    """A tiny random checkpoint of a WITH_VISION family (Qwen3.5-4B's, Qwen3-VL-8B's class: config with a
    `text_config`, the language model under `model.language_model.`, a one-layer vision tower beside it), saved with
    the test tokenizer once per module: its directory and the model (the reference)."""
    import torch
    import transformers

    from support import decoder_checkpoints

    built: dict[str, tuple[Path, Any]] = {}

    def checkpoint(family: str) -> tuple[Path, Any]:
        if family not in built:
            model_class, config_of, _ = WITH_VISION[family]
            torch.manual_seed(5)
            model = getattr(transformers, model_class)(getattr(decoder_checkpoints, config_of)()).eval()
            decoder_checkpoints.perturb(model)
            directory = tmp_path_factory.mktemp(f"{family}-vision")
            model.save_pretrained(directory)
            write_tokenizer(directory)
            built[family] = (directory, model)
        return built[family]

    return checkpoint


@pytest.mark.parametrize("family", sorted(WITH_VISION))
async def test_a_vision_language_checkpoint_converts_and_generates_as_its_language_model(
    family: str, with_vision: Callable[[str], tuple[Path, Any]], model_loader: ModelLoader, tmp_path: Path
) -> None:
    """The language model of a Qwen3.5 or a Qwen3-VL with its vision tower converts (the tower is never read; a
    Qwen3-VL's is a Qwen3: its multimodal RoPE sections coincide for text, its deepstack features come from images
    only): the decoder equals transformers' whole model on text, left-padded and step by step, and greedy text
    through the model loader equals its generate."""
    import torch

    directory, model = with_vision(family)
    converted = convert_decoder_checkpoint(directory, tmp_path / "decoder")
    saved = json.loads((converted.directory / "config.json").read_text())
    assert saved["model_type"] == WITH_VISION[family][2]
    prompts = [[5, 9, 11, 4, 30], [7, 8]]
    for seen, logits in run_generation_graph(session(converted.graph), CacheShape.from_config(saved), prompts, 2):
        for row, ids in enumerate(seen):
            assert float(np.abs(logits[row] - reference_logits(model, ids)).max()) <= TOLERANCE, ids
    loaded = model_loader.load(generation_yaml(directory, family), "default", f"acme/{family}-chat")
    try:
        ids = loaded.tokenizer.encode_batch(["w1 w2 w3"])[0].input_ids.tolist()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                 pad_token_id=0)  # fmt: skip
        expected = loaded.adapter.decode_text(out[0, len(ids) :].tolist())
        request = GenerateParams(prompt="w1 w2 w3", max_new_tokens=12, temperature=0.0)
        assert await generate_all(loaded.adapter, [request]) == [expected]
    finally:
        loaded.close()


def test_qwen3_vl_embedding_writes_each_text_into_its_chat_template(
    with_vision: Callable[[str], tuple[Path, Any]], public_wheel: Path, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Qwen3-VL-Embedding-2B's public YAML (its module's recipe, text only): each text is the user turn of the
    checkpoint's chat template (here in the processor's chat_template.json), the instruction its system turn —
    the request's, a full stop added, or "Represent the user's input." —, the assistant's turn opened; the last
    token's state, normalised. Equal to the public adapter's recipe run with transformers; images are refused."""
    import shutil
    import zipfile

    source, model = with_vision("qwen3_vl")
    directory = tmp_path / "model"
    shutil.copytree(source, directory)
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    del tokenizer_config["chat_template"]
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": qwen3_vl_recipes.VL_CHAT_TEMPLATE}))
    with zipfile.ZipFile(public_wheel) as wheel:
        text = wheel.read("sie_server/models/Qwen__Qwen3-VL-Embedding-2B.yaml").decode()
    data = load_yaml(text, "Qwen__Qwen3-VL-Embedding-2B.yaml") | {"weights_path": str(directory)}
    data["tasks"]["encode"]["dense"]["dim"] = 32
    loaded = model_loader.load(parse_model_config(data), "default", "Qwen/Qwen3-VL-Embedding-2B")
    reference = qwen3_vl_recipes.reference_tokenizer(directory)
    try:
        texts = ["w1 w2 w3", "w4"]
        for instruction, written in ((None, "Represent the user's input."), ("find w3", "find w3."),
                                     ("  find w5?", "find w5?")):  # fmt: skip
            items = encode_items(texts, is_query=True, instruction=instruction)
            for text, result in zip(texts, loaded.adapter.encode(items).items, strict=True):
                assert result.ok, result.error
                ours = np.asarray(result.result["dense"]["values"])
                expected = qwen3_vl_recipes.embedding(model, reference, text, written)
                assert float(np.abs(ours - expected).max()) <= TOLERANCE, (text, instruction)
        pictured = EncodeBatchItem(work_item_id="e.0", request_id="e", item_index=0, total_items=1, timestamp=0.0,
                                   item={"text": "w1", "images": [{"data": b"\x89PNG", "format": "png"}]})  # fmt: skip
        assert "image inputs are not served" in str(loaded.adapter.encode([pictured]).items[0].error)
    finally:
        loaded.close()


def test_qwen3_vl_reranker_scores_text_pairs_as_its_public_recipe(
    with_vision: Callable[[str], tuple[Path, Any]], public_wheel: Path, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Qwen3-VL-Reranker-2B's public YAML (text pairs): the judge's system turn and a user turn of text parts
    (`<Instruct>: …`, `<Query>:`, the query, `\n<Document>:`, the document) rendered by the checkpoint's chat
    template, the assistant's turn opened, tokenized whole; sigmoid(yes − no) at the last position, equal to the
    public adapter's recipe run with transformers. A pair over the context loses its document's last tokens."""
    import shutil
    import zipfile

    source, model = with_vision("qwen3_vl")
    directory = tmp_path / "model"
    shutil.copytree(source, directory)
    tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    template = {"chat_template": qwen3_vl_recipes.VL_CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config | template))
    with zipfile.ZipFile(public_wheel) as wheel:
        text = wheel.read("sie_server/models/Qwen__Qwen3-VL-Reranker-2B.yaml").decode()
    data = load_yaml(text, "Qwen__Qwen3-VL-Reranker-2B.yaml") | {"weights_path": str(directory),
                                                                  "max_sequence_length": 80}  # fmt: skip
    loaded = model_loader.load(parse_model_config(data), "default", "Qwen/Qwen3-VL-Reranker-2B")
    reference = qwen3_vl_recipes.reference_tokenizer(directory)

    def expected(query: str, document: str) -> float:
        return qwen3_vl_recipes.rerank_score(model, reference, query, document)

    try:
        query, documents = "w1 w2", ["w1 w2 w3", "w20 w21", "w5"]
        ours = reranker_scores(loaded, query, documents)
        for index, document in enumerate(documents):
            assert abs(ours[f"item-{index}"] - expected(query, document)) <= TOLERANCE, document
        # over the 80-token context: the document keeps as many of its first words as fit
        long_document = " ".join(f"w{index % 50}" for index in range(90))
        assert len(loaded.adapter.pair_ids(query, long_document, None)) == 80
        kept = 80 - (len(loaded.adapter.pair_ids(query, "", None)) - 1)  # "NULL" is one (unknown) token
        cut = " ".join(long_document.split()[:kept])
        assert abs(reranker_scores(loaded, query, [long_document])["item-0"] - expected(query, cut)) <= TOLERANCE
        with pytest.raises(ValueError, match="the instruction, query and template take 1[0-9][0-9] tokens of the "
                                             "model's 80"):  # fmt: skip
            loaded.adapter.pair_ids(" ".join(["w1"] * 100), "w2", None)
        pictured = SimpleNamespace(
            query_item={"text": "w1"},
            options=None,
            instruction=None,
            score_items=[{"text": "w2", "images": [{"data": b"\x89PNG", "format": "png"}]}],
        )
        assert "image inputs are not served" in str(loaded.adapter.score([pictured]).items[0].error)
    finally:
        loaded.close()


def test_gemma4s_thought_channel_is_left_out_of_its_answers(
    with_vision: Callable[[str], tuple[Path, Any]], public_wheel: Path, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Gemma 4 E2B's public YAML switches thinking off; the model may still open its thought channel
    (`<|channel>thought…<channel|>`, special tokens of its vocabulary): the answer leaves it out, as the public
    server's gemma4 reasoning parser does, and what follows the channel is the answer."""
    import shutil
    import zipfile

    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    source, _ = with_vision("gemma4")
    directory = tmp_path / "model"
    shutil.copytree(source, directory)
    vocabulary = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab()
    renamed = {"w54": "<|channel>", "w55": "<channel|>"}  # the markers in place of two words: the model's 64 ids
    tokenizer = Tokenizer(WordLevel({renamed.get(word, word): index for word, index in vocabulary.items()},
                                    unk_token="<unk>"))  # fmt: skip
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", *renamed.values()])
    tokenizer.save(str(directory / "tokenizer.json"))
    opened, closed = tokenizer.token_to_id("<|channel>"), tokenizer.token_to_id("<channel|>")
    with zipfile.ZipFile(public_wheel) as wheel:
        text = wheel.read("sie_server/models/google__gemma-4-E2B-it.yaml").decode()
    data = load_yaml(text, "google__gemma-4-E2B-it.yaml") | {"weights_path": str(directory)}
    loaded = model_loader.load(parse_model_config(data), "default", "google/gemma-4-E2B-it")
    try:
        words = tokenizer.encode("w1 w2 w3 w4", add_special_tokens=False).ids
        channel = [opened, *words[:2], closed]
        assert loaded.adapter.decode_text([*channel, *words[2:]]) == "w3 w4"
        assert loaded.adapter.decode_text(channel[:3]) == ""  # inside the channel: nothing yet
        assert loaded.adapter.decode_text(words) == "w1 w2 w3 w4"
    finally:
        loaded.close()


@pytest.mark.parametrize(
    ("yaml_file", "checkpoint", "sampling"),
    [("Qwen__Qwen3.5-4B.yaml", "qwen3_5", (0.7, 0.8, 0, 1.5, 0)),
     ("Qwen__Qwen3-VL-8B-Instruct.yaml", "qwen3_vl", (0.7, 0.8, 20, 1.5, 1)),
     ("google__gemma-4-E2B-it.yaml", "gemma4", (1.0, 0.95, 64, 0.0, 1)),
     ("google__gemma-4-E4B-it.yaml", "gemma4", (1.0, 0.95, 64, 0.0, 1))],
)  # fmt: skip
def test_a_public_generation_yaml_serves_a_checkpoint_of_its_class(
    yaml_file: str, checkpoint: str, sampling: tuple, public_wheel: Path, model_loader: ModelLoader,
    with_vision: Callable[[str], tuple[Path, Any]],
) -> None:  # fmt: skip
    """The public catalogue's Qwen3.5-4B, Qwen3-VL-8B-Instruct and Gemma 4 E2B/E4B YAMLs as they are
    (sglang.generation, sglang.gemma; their NEXTN/MTP and SGLang launch options aside) load a checkpoint of their
    class: their default sampling (temperature, top-p, top-k, presence penalty, min_new_tokens), stop token (Gemma
    4's names Gemma 3's `<end_of_turn>`, not a token of this vocabulary: it stops as text) and chat template switch
    apply."""
    import zipfile

    directory, _ = with_vision(checkpoint)
    with zipfile.ZipFile(public_wheel) as wheel:
        text = wheel.read(f"sie_server/models/{yaml_file}").decode()
    data = load_yaml(text, yaml_file) | {"weights_path": str(directory)}
    model = parse_model_config(data)
    loaded = model_loader.load(model, "default", model.sie_id)
    try:
        params = loaded.adapter.prepare(GenerateParams(messages=[{"role": "user", "content": "w1"}])).params
        assert (params.temperature, params.top_p, params.top_k, params.presence_penalty, params.min_tokens) == sampling
        if checkpoint == "gemma4":
            assert params.stop == ("<end_of_turn>",)
        else:
            assert IM_END in params.stop_token_ids
    finally:
        loaded.close()


def test_qwen3_5_prompts_over_several_chunks_equal_transformers(tmp_path: Path) -> None:
    """A prompt runs the delta rule in chunks of 64 tokens (`gated_delta.CHUNK`), a decode step one token at a time:
    prompts of one, two and three chunks (one exactly 64, one a token over) and a token repeated 150 times (keys
    alike: the chunks' triangular systems at their least well-conditioned) equal transformers, left-padded together
    and then step by step; the hidden-state graph too, right-padded. One linear-attention layer and one attention
    layer: over 150 tokens a deeper random model amplifies float32 rounding past 1e-4 in transformers itself (its
    float32 states differ from its float64 ones by up to 1e-4 at four layers)."""
    import torch

    from support.decoder_checkpoints import qwen3_5_config

    config = qwen3_5_config()
    config.num_hidden_layers, config.layer_types = 2, ["linear_attention", "full_attention"]
    model = random_causal_lm("qwen3_5", config=config)
    model.save_pretrained(tmp_path / "model")
    write_tokenizer(tmp_path / "model")
    converted = convert_decoder_checkpoint(tmp_path / "model", tmp_path / "decoder")
    shape = CacheShape.from_config(json.loads((converted.directory / "config.json").read_text()))
    rng = np.random.default_rng(4)
    prompts = [rng.integers(4, VOCAB, size=length).tolist() for length in (130, 64, 65)] + [[7] * 150]
    for seen, logits in run_generation_graph(session(converted.graph), shape, prompts, 2):
        for row, ids in enumerate(seen):
            assert float(np.abs(logits[row] - reference_logits(model, ids)).max()) <= TOLERANCE, len(ids)
    convert_decoder_hidden(tmp_path / "model", tmp_path / "hidden.onnx")
    ids = np.zeros((len(prompts), 150), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)], mask[row, : len(prompt)] = prompt, 1
    (hidden,) = session(tmp_path / "hidden.onnx").run(None, {"input_ids": ids, "attention_mask": mask})
    for row, prompt in enumerate(prompts):
        with torch.no_grad():
            expected = model.model(torch.tensor([prompt])).last_hidden_state[0].numpy()
        assert float(np.abs(hidden[row, : len(prompt)] - expected).max()) <= TOLERANCE, len(prompt)


def test_a_qwen3_5_config_without_its_text_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "vision_config": {}}))
    with pytest.raises(ConversionError, match="a qwen3_5 config needs a qwen3_5_text text_config"):
        convert_decoder_checkpoint(tmp_path, tmp_path / "decoder")


def test_a_gemma3_config_without_a_text_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "vision_config": {}}))
    with pytest.raises(ConversionError, match="a gemma3 config needs a text_config"):
        convert_decoder_checkpoint(tmp_path, tmp_path / "decoder")


def test_a_sliding_window_is_applied(tmp_path: Path) -> None:
    """The check above can fail on the window: the same Mistral weights without it answer differently."""
    import transformers

    model = save_causal_lm(tmp_path / "mistral", "mistral")
    converted = convert_decoder_checkpoint(tmp_path / "mistral", tmp_path / "decoder")
    graph = session(converted.graph)
    shape = CacheShape.from_config(json.loads((converted.directory / "config.json").read_text()))
    prompt = list(range(4, 4 + LENGTHS[0]))
    _, logits = next(run_generation_graph(graph, shape, [prompt], 0))
    full = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "mistral", sliding_window=None).eval()
    assert float(np.abs(logits[0] - reference_logits(model, prompt)).max()) <= TOLERANCE
    assert float(np.abs(logits[0] - reference_logits(full, prompt)).max()) > 100 * TOLERANCE


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "both-ways"])
def test_the_hidden_state_graph_equals_transformers(checkpoint, bidirectional: bool, tmp_path: Path) -> None:
    """Causal, and attending both ways as transformers runs the model with `is_causal=False` (the public server's
    forward argument for GritLM): the windows of Mistral, Qwen2 and Gemma 3 then reach both sides."""
    import torch

    family, directory, model = checkpoint
    convert_decoder_hidden(directory, tmp_path / "hidden.onnx", bidirectional=bidirectional)
    rng = np.random.default_rng(2)
    width = max(LENGTHS)
    ids = np.zeros((len(LENGTHS), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = rng.integers(4, VOCAB, size=length)
        mask[row, :length] = 1
    (hidden,) = session(tmp_path / "hidden.onnx").run(None, {"input_ids": ids, "attention_mask": mask})
    for row, length in enumerate(LENGTHS):
        with torch.no_grad():
            inputs = torch.tensor(ids[row : row + 1, :length])
            expected = model.model(inputs, is_causal=not bidirectional).last_hidden_state[0].numpy()
            causal = model.model(inputs).last_hidden_state[0].numpy()
        assert float(np.abs(hidden[row, :length] - expected).max()) <= TOLERANCE, family
        if bidirectional and length > 1:
            assert float(np.abs(expected - causal).max()) > 100 * TOLERANCE  # the reference did attend both ways


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma3", "llama_bidirec"])
def test_a_config_that_is_not_causal_converts_attending_both_ways(family: str, tmp_path: Path) -> None:
    """gte-Qwen2-7B-instruct's config.json says `is_causal: false` (its remote code reads it, and transformers now
    does): the hidden-state graph of such a checkpoint equals transformers' bidirectional model, windows included;
    its generation graph is refused, naming why. NVIDIA's `llama_bidirec` (llama-embed-nemotron-8b: Llama whose
    remote code builds a padding-only mask) reads the same way."""
    import torch

    built = "llama" if family == "llama_bidirec" else family
    config = family_config(built)
    config.is_causal = False
    base = random_causal_lm(built, config=config).model
    base.save_pretrained(tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["is_causal"] is False
    if family == "llama_bidirec":  # its config as the remote code saves it: the model type, no is_causal
        del saved["is_causal"]
        saved |= {"model_type": "llama_bidirec", "architectures": ["LlamaBidirectionalModel"], "pooling": "avg"}
        (tmp_path / "model" / "config.json").write_text(json.dumps(saved))
    convert_decoder_hidden(tmp_path / "model", tmp_path / "hidden.onnx")
    ids = np.random.default_rng(3).integers(4, VOCAB, size=(1, max(LENGTHS)))
    (hidden,) = session(tmp_path / "hidden.onnx").run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    with torch.no_grad():
        expected = base(torch.tensor(ids)).last_hidden_state.numpy()
    assert float(np.abs(hidden - expected).max()) <= TOLERANCE
    with pytest.raises(ConversionError, match="attends both ways"):
        convert_decoder_checkpoint(tmp_path / "model", tmp_path / "decoder")


def generation_yaml(directory: Path, family: str) -> Any:
    return parse_model_config(
        {
            "sie_id": f"acme/{family}-chat",
            "weights_path": str(directory),
            "tasks": {"generate": {"max_output_tokens": 64}},
            "profiles": {"default": {"adapter_path": "sie_server.adapters.sglang.generation:SGLangGenerationAdapter",
                                     "max_batch_tokens": 1024}},
        }
    )  # fmt: skip


async def generate_all(adapter: Any, requests: list[GenerateParams]) -> list[str]:
    async def one(index: int, params: GenerateParams) -> str:
        prepared = await asyncio.to_thread(adapter.prepare, params)
        stream = adapter.start(prepared, f"r{index}", f"s{index}")
        texts = []
        while not (event := await stream.next()).done:
            texts.append(event.text)
        assert event.error is None and event.finish_reason == "length"
        return "".join(texts) + event.text

    return await asyncio.gather(*(one(index, params) for index, params in enumerate(requests)))


async def test_greedy_generation_equals_transformers_generate_alone_and_in_a_batch(
    checkpoint, model_loader: ModelLoader
) -> None:
    import torch

    family, directory, model = checkpoint
    loaded = model_loader.load(generation_yaml(directory, family), "default", f"acme/{family}-chat")
    try:
        adapter = loaded.adapter
        prompts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11 w12 w13", "w14 w15"]
        expected = []
        for prompt in prompts:
            ids = loaded.tokenizer.encode_batch([prompt])[0].input_ids.tolist()
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, min_new_tokens=32,
                                     pad_token_id=0)  # fmt: skip
            expected.append(adapter.decode_text(out[0, len(ids) :].tolist()))
        requests = [GenerateParams(prompt=prompt, max_new_tokens=32, temperature=0.0) for prompt in prompts]
        alone = await generate_all(adapter, requests[:1])
        together = await generate_all(adapter, requests)
        assert alone == expected[:1]
        assert together == expected
        # a chat renders with the checkpoint's template and decodes like its rendered prompt
        chat = GenerateParams(messages=[{"role": "user", "content": "w3 w4"}], max_new_tokens=8, temperature=0.0)
        rendered = GenerateParams(prompt="<|im_start|>user w3 w4<|im_end|><|im_start|>assistant", max_new_tokens=8,
                                  temperature=0.0)  # fmt: skip
        assert await generate_all(adapter, [chat]) == await generate_all(adapter, [rendered])
    finally:
        loaded.close()


async def test_a_profiles_default_sampling_and_stop_tokens_apply_to_requests_that_leave_them_out(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    """The public generation YAMLs' runtime `default_sampling` (Qwen3Guard's temperature 0) and `stop_tokens`
    (translategemma's `<end_of_turn>`): a request without a temperature decodes greedily, token for token as
    transformers' greedy generate, and ends at the stop token (its text left out, finish reason stop); a request's
    own settings still win; a stop token that is not one token stops as a stop string; a default this engine does
    not apply fails the load."""
    import torch

    model = save_causal_lm(tmp_path / "model", "qwen3")
    raw = {"sie_id": "acme/guard", "weights_path": str(tmp_path / "model"),
           "tasks": {"generate": {"max_output_tokens": 64}},
           "profiles": {"default": {"adapter_path": "sie_server.adapters.sglang.generation:SGLangGenerationAdapter",
                                    "max_batch_tokens": 1024}}}  # fmt: skip
    tokenizer = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    ids = tokenizer.encode("w1 w2 w3").ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=0)
    greedy = out[0, len(ids) :].tolist()
    cut = next(index for index in range(3, len(greedy)) if greedy[index] not in greedy[:index])
    runtime = {"default_sampling": {"temperature": 0.0, "top_p": 1.0},
               "stop_tokens": [tokenizer.id_to_token(greedy[cut])]}  # fmt: skip
    raw["profiles"]["default"]["adapter_options"] = {"runtime": runtime}
    loaded = model_loader.load(parse_model_config(raw), "default", "acme/guard")
    try:
        adapter = loaded.adapter
        prepared = await asyncio.to_thread(adapter.prepare, GenerateParams(prompt="w1 w2 w3", max_new_tokens=24))
        assert (prepared.params.temperature, prepared.params.top_p) == (0.0, 1.0)
        assert greedy[cut] in prepared.params.stop_token_ids
        stream = adapter.start(prepared, "r0", "s0")
        texts = []
        while not (event := await stream.next()).done:
            texts.append(event.text)
        assert event.error is None and event.finish_reason == "stop"
        assert "".join(texts) + event.text == adapter.decode_text(greedy[:cut])
        own = GenerateParams(prompt="w1", max_new_tokens=4, temperature=0.7, top_p=0.5, seed=3)
        assert attrs.astuple(adapter.prepare(own).params)[:4] == (0.7, 0.5, 0, 3)
    finally:
        loaded.close()
    # a stop token that is not one token of the vocabulary stops as text, as the public server's engine reads it
    raw["profiles"]["default"]["adapter_options"] = {"runtime": {"stop_tokens": ["w1 w2", "<|im_end|>"]}}
    loaded = model_loader.load(parse_model_config(raw), "default", "acme/guard")
    try:
        params = loaded.adapter.prepare(GenerateParams(prompt="w1", max_new_tokens=4, stop=["w3"])).params
        assert params.stop == ("w3", "w1 w2") and IM_END in params.stop_token_ids
    finally:
        loaded.close()
    refused = {"['repetition_penalty'] are not applied": {"default_sampling": {"repetition_penalty": 1.05}},
               "presence_penalty must be a number from -2 to 2": {"default_sampling": {"presence_penalty": 3}},
               "temperature must be a finite number >= 0": {"default_sampling": {"temperature": -1}},
               "at most 4 stop strings": {"stop_tokens": ["a b", "b c", "c d", "d e", "e f"]}}  # fmt: skip
    for named, runtime in refused.items():
        raw["profiles"]["default"]["adapter_options"] = {"runtime": runtime}
        with pytest.raises(ModelLoadError, match=re.escape(named)):
            model_loader.load(parse_model_config(raw), "default", "acme/guard")


async def test_a_profiles_presence_penalty_decodes_as_transformers_with_openais_penalty(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Qwen3.5-4B's YAML samples with `presence_penalty: 1.5`: greedy decoding with a profile's presence and frequency
    penalties equals transformers' greedy generate with OpenAI's penalty on the generated tokens as a logits
    processor, and differs from it without (the penalty changed the text); a request's own penalties win."""
    import torch
    import transformers

    model = save_causal_lm(tmp_path / "model", "qwen3")
    tokenizer = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    ids = tokenizer.encode("w1 w2 w3").ids

    class OpenAIPenalty(transformers.LogitsProcessor):
        def __init__(self, presence: float, frequency: float) -> None:
            self.presence, self.frequency = presence, frequency

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            generated = input_ids[0, len(ids) :]
            counts = torch.bincount(generated, minlength=scores.shape[-1]).to(scores.dtype)
            return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)

    def greedy(presence: float, frequency: float) -> list[int]:
        processors = transformers.LogitsProcessorList([OpenAIPenalty(presence, frequency)])
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                                 pad_token_id=0, logits_processor=processors)  # fmt: skip
        return out[0, len(ids) :].tolist()

    raw = {
        "sie_id": "acme/penalised",
        "weights_path": str(tmp_path / "model"),
        "tasks": {"generate": {"max_output_tokens": 64}},
        "profiles": {
            "default": {
                "adapter_path": "sie_server.adapters.sglang.generation:SGLangGenerationAdapter",
                "max_batch_tokens": 1024,
                "adapter_options": {
                    "runtime": {
                        "default_sampling": {"temperature": 0.0, "presence_penalty": 1.5, "frequency_penalty": 0.5}
                    }
                },
            }
        },
    }
    loaded = model_loader.load(parse_model_config(raw), "default", "acme/penalised")
    try:
        adapter = loaded.adapter
        penalised, own = greedy(1.5, 0.5), greedy(-1.0, 0.0)
        assert penalised != greedy(0.0, 0.0)
        by_default = await generate_all(adapter, [GenerateParams(prompt="w1 w2 w3", max_new_tokens=20)])
        assert by_default == [adapter.decode_text(penalised)]
        request = GenerateParams(prompt="w1 w2 w3", max_new_tokens=20, presence_penalty=-1.0, frequency_penalty=0.0)
        assert await generate_all(adapter, [request]) == [adapter.decode_text(own)]
    finally:
        loaded.close()


SWITCHED_TEMPLATE = CHAT_TEMPLATE + (
    "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %} w40 w41{% endif %}"
    "{% if guardian_config is defined %} risk {{ guardian_config.risk_name }}{% endif %}"
)


def test_chat_template_switches_of_the_entry_and_profile_render_as_transformers_does(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Qwen3-0.6B's YAML turns thinking off in `tasks.generate.chat_template_kwargs` and its `thinking` profile on;
    granite-guardian's names a risk: the prompt each profile renders is transformers' `apply_chat_template` with the
    same keyword arguments, and a model whose thinking is switched hides its reasoning block; a switch the public
    server does not pass fails the load naming it."""
    import transformers

    save_causal_lm(tmp_path / "model", "qwen3")
    config_file = tmp_path / "model" / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "chat_template": SWITCHED_TEMPLATE}))
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    messages = [{"role": "user", "content": "w1 w2"}]
    generation = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"

    def entry(task_switches: Any, profile_switches: Any = None) -> Any:
        thinking = {"extends": "default"} | ({"chat_template_kwargs": profile_switches} if profile_switches else {})
        return parse_model_config(
            {"sie_id": "acme/qwen3", "weights_path": str(tmp_path / "model"),
             "tasks": {"generate": {"max_output_tokens": 8, "chat_template_kwargs": task_switches}},
             "profiles": {"default": {"adapter_path": generation, "max_batch_tokens": 512}, "thinking": thinking}}
        )  # fmt: skip

    cases = [  # (task switches, profile switches, profile, what transformers is given)
        ({"enable_thinking": False}, {"enable_thinking": True}, "default", {"enable_thinking": False}),
        ({"enable_thinking": False}, {"enable_thinking": True}, "thinking", {"enable_thinking": True}),
        ({"guardian_config": {"risk_name": "harm"}}, None, "default", {"guardian_config": {"risk_name": "harm"}}),
        ({}, None, "default", {}),
    ]
    for task_switches, profile_switches, profile, switches in cases:
        loaded = model_loader.load(entry(task_switches, profile_switches), profile, "acme/qwen3")
        try:
            ours = loaded.adapter.prompt_text(GenerateParams(messages=messages))
            # a model whose thinking is switched answers without its <think> block (tests/unit: the block's rules)
            assert loaded.adapter.hides_reasoning == ("enable_thinking" in switches)
        finally:
            loaded.close()
        expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **switches)
        assert ours == expected, (profile, switches)
    off = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert "w40 w41" in off  # the switch is in the template
    # a chat request's own switches, the entry's winning where both set one (as the public server merges them)
    on = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    for task_switches, asked, expected in (({}, {"enable_thinking": False}, off),
                                           ({"enable_thinking": True}, {"enable_thinking": False}, on)):  # fmt: skip
        loaded = model_loader.load(entry(task_switches), "default", "acme/qwen3")
        try:
            params = GenerateParams(messages=messages, chat_template_kwargs=asked)
            assert loaded.adapter.prompt_text(params) == expected
            with pytest.raises(ValueError, match="are not chat template switches"):
                loaded.adapter.prompt_text(GenerateParams(messages=messages, chat_template_kwargs={"x": 1}))
        finally:
            loaded.close()
    refused = {"['tools'] are not chat template switches": {"tools": []},
               "enable_thinking must be true or false": {"enable_thinking": "no"},
               "guardian_config must be {risk_name": {"guardian_config": {"risk_name": ""}}}  # fmt: skip
    for named, switches in refused.items():
        with pytest.raises(ModelLoadError, match=re.escape(named)):
            model_loader.load(entry(switches), "default", "acme/qwen3")


def test_a_sharded_checkpoint_converts_to_the_same_decoder(tmp_path: Path) -> None:
    save_causal_lm(tmp_path / "single", "qwen3")
    save_causal_lm(tmp_path / "sharded", "qwen3", max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    graphs = [
        convert_decoder_checkpoint(tmp_path / name, tmp_path / f"{name}-out").graph for name in ("single", "sharded")
    ]
    shape = CacheShape.from_config(json.loads((tmp_path / "single-out" / "config.json").read_text()))
    prompt = [[5, 6, 7, 8]]
    (_, first), (_, second) = (next(run_generation_graph(session(graph), shape, prompt, 0)) for graph in graphs)
    np.testing.assert_array_equal(first, second)


def assert_same_decoder(from_gguf: Any, from_checkpoint: Any, model: Any) -> None:
    """The two conversions of the same weights give the same logits (1e-5) on a left-padded batch and three cached
    steps, and transformers' own (1e-4)."""
    shape = CacheShape.from_config(json.loads((from_gguf.directory / "config.json").read_text()))
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    for (seen, ours), (_, theirs) in zip(
        run_generation_graph(session(from_gguf.graph), shape, prompts, 3),
        run_generation_graph(session(from_checkpoint.graph), shape, prompts, 3),
        strict=True,
    ):
        assert float(np.abs(ours - theirs).max()) <= 1e-5
        for row, ids in enumerate(seen):
            assert float(np.abs(ours[row] - reference_logits(model, ids)).max()) <= TOLERANCE


def test_a_gguf_and_a_checkpoint_of_the_same_weights_give_the_same_logits(tmp_path: Path) -> None:
    import torch
    import transformers

    tiny = llama_reference.random_llama()
    gguf_out = convert_gguf(llama_reference.write_gguf(tiny, tmp_path / "tiny.gguf"), tmp_path / "from-gguf")
    config = transformers.LlamaConfig(
        hidden_size=llama_reference.HIDDEN, intermediate_size=llama_reference.INTERMEDIATE,
        num_hidden_layers=llama_reference.LAYERS, num_attention_heads=llama_reference.HEADS,
        num_key_value_heads=llama_reference.KV_HEADS, vocab_size=llama_reference.VOCAB,
        max_position_embeddings=llama_reference.CONTEXT, rope_theta=llama_reference.ROPE_BASE,
        rms_norm_eps=llama_reference.RMS_EPS, tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    state = {"model.embed_tokens.weight": tiny.embeddings, "model.norm.weight": tiny.final_norm}
    for index, layer in enumerate(tiny.layers):
        parts = {"input_layernorm": layer.attn_norm, "self_attn.q_proj": layer.q, "self_attn.k_proj": layer.k,
                 "self_attn.v_proj": layer.v, "self_attn.o_proj": layer.o, "post_attention_layernorm": layer.ffn_norm,
                 "mlp.gate_proj": layer.gate, "mlp.up_proj": layer.up, "mlp.down_proj": layer.down}  # fmt: skip
        state |= {f"model.layers.{index}.{part}.weight": array for part, array in parts.items()}
    model.load_state_dict({name: torch.from_numpy(array) for name, array in state.items()}, strict=False)
    model.tie_weights()
    model.save_pretrained(tmp_path / "checkpoint")
    checkpoint_out = convert_decoder_checkpoint(tmp_path / "checkpoint", tmp_path / "from-checkpoint")
    assert_same_decoder(gguf_out, checkpoint_out, model)


# (family, public adapter module, pooling, query template, append_eos): as the public catalogue's YAMLs of
# Qwen3-Embedding (its tokenizer ends texts with <|endoftext|>), e5-mistral (the server appends the end token) and
# gte-Qwen2 configure them
EMBEDDERS = {
    "qwen3": ("sie_server.adapters.qwen2_flash:Qwen2FlashAdapter", "last", "Instruct: {instruction}\nQuery:{text}",
              False),
    "mistral": ("sie_server.adapters.sglang.embedding:SGLangEmbeddingAdapter", "last_token",
                "Instruct: {instruction}\nQuery: {text}", True),
    "qwen2": ("sie_server.adapters.pytorch_embedding:PyTorchEmbeddingAdapter", "mean", None, False),
    # a Qwen3.5 backbone (its linear-attention layers right-padded) in Qwen3-Embedding's recipe
    "qwen3_5": ("sie_server.adapters.qwen2_flash:Qwen2FlashAdapter", "last", "Instruct: {instruction}\nQuery:{text}",
                False),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(EMBEDDERS))
def test_decoder_embeddings_equal_transformers_pooled(family: str, model_loader: ModelLoader, tmp_path: Path) -> None:
    import torch

    adapter_path, pooling, template, append_eos = EMBEDDERS[family]
    base = save_base_model(tmp_path / "model", family, end_with_eos=not append_eos)
    runtime = {"pooling": pooling, "normalize": True, "default_instruction": "w7 w8"}
    if template:
        runtime["query_template"] = template
    model = parse_model_config(
        {
            "sie_id": f"acme/{family}-embed",
            "weights_path": str(tmp_path / "model"),
            "max_sequence_length": 64,
            "tasks": {"encode": {"dense": {"dim": 32}}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 1024, "adapter_options": {
                "loadtime": {"causal": True, "append_eos": append_eos}, "runtime": runtime}}},
        }
    )  # fmt: skip
    loaded = model_loader.load(model, "default", model.sie_id)
    tokenizer = write_tokenizer(tmp_path / "reference-tokenizer", end_with_eos=True)  # every text ends <|endoftext|>
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", " ".join(["w9"] * 80)]  # the last one is cut at 64
    for is_query in (True, False):
        results = loaded.adapter.encode(encode_items(texts, is_query=is_query)).items
        for text, result in zip(texts, results, strict=True):
            assert result.ok, result.error
            seen = template.replace("{instruction}", "w7 w8").replace("{text}", text) if template and is_query else text
            ids = tokenizer.encode(seen).ids
            if len(ids) > 64:
                ids = ids[:63] + ids[-1:]  # cut as the tokenizer cuts: the closing token kept
            with torch.no_grad():
                hidden = base(torch.tensor([ids])).last_hidden_state[0].numpy()
            pooled = hidden.mean(0) if pooling == "mean" else hidden[-1]
            expected = pooled / np.linalg.norm(pooled)
            assert float(np.abs(np.asarray(result.result["dense"]["values"]) - expected).max()) <= TOLERANCE


def test_a_converted_graph_with_a_side_file_is_cached_with_it(
    model_loader: ModelLoader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph converted to a file of its own (a decoder's hidden states, an encoder) is written in a scratch
    directory and moved into the cache: its side file of tensors must move with it, or the cached graph names
    tensors that are gone (every graph past SIDE_FILE_BYTES has one)."""
    from sie.worker.convert import graph_builder

    monkeypatch.setattr(graph_builder, "SIDE_FILE_BYTES", 0)
    save_base_model(tmp_path / "model", "qwen2", end_with_eos=True)
    adapter_path, pooling, _, _ = EMBEDDERS["qwen2"]
    model = parse_model_config(
        {
            "sie_id": "acme/qwen2-embed", "weights_path": str(tmp_path / "model"), "max_sequence_length": 64,
            "tasks": {"encode": {"dense": {"dim": 32}}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 1024, "adapter_options": {
                "loadtime": {"causal": True}, "runtime": {"pooling": pooling}}}},
        }
    )  # fmt: skip
    converted = tmp_path / "converted"
    vectors = []
    for _ in range(2):  # converted, then read back from the cache by another loader
        loader = ModelLoader(model_loader.resolver, converted, SessionOptions(intra_op_threads=1))
        loaded = loader.load(model, "default", model.sie_id)
        try:
            (result,) = loaded.adapter.encode(encode_items(["w1 w2 w3"])).items
            assert result.ok, result.error
            vectors.append(result.result["dense"]["values"])
        finally:
            loaded.close()
    (graph,) = converted.glob("*.onnx")
    assert (converted / f"{graph.name}.data").stat().st_size > 0
    assert not list(converted.glob("tmp*"))  # the scratch directory is gone, and nothing else was needed from it
    np.testing.assert_array_equal(vectors[0], vectors[1])


SENTENCE_TRANSFORMER = "sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter"


def test_an_embeddinggemma_stack_equals_sentence_transformers(model_loader: ModelLoader, tmp_path: Path) -> None:
    """embeddinggemma's shape: a Gemma 3 that attends both ways (its sliding layers within half the window either
    side), mean pooling, two Dense layers without bias and Normalize, saved by sentence-transformers and served
    through the public `sentence_transformer` module, as the catalogue's YAML does."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    base = random_causal_lm("gemma3", config=gemma3_config(bidirectional=True)).model
    base.save_pretrained(tmp_path / "base")
    write_tokenizer(tmp_path / "base", end_with_eos=True, eos_token="<|endoftext|>")
    torch.manual_seed(1)
    stack = [models.Transformer(str(tmp_path / "base")), models.Pooling(32, pooling_mode="mean"),
             models.Dense(32, 64, bias=False, activation_function=torch.nn.Identity()),
             models.Dense(64, 32, bias=False, activation_function=torch.nn.Identity()), models.Normalize()]  # fmt: skip
    SentenceTransformer(modules=stack, device="cpu").save(str(tmp_path / "st"))
    model = parse_model_config(
        {"sie_id": "acme/embeddinggemma", "weights_path": str(tmp_path / "st"), "max_sequence_length": 64,
         "tasks": {"encode": {"dense": {"dim": 32}}},
         "profiles": {"default": {"adapter_path": SENTENCE_TRANSFORMER, "max_batch_tokens": 1024}}}
    )  # fmt: skip
    loaded = model_loader.load(model, "default", model.sie_id)
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11 w12 w13"]  # longer than the window: it matters
    ours = [item.result["dense"]["values"] for item in loaded.adapter.encode(encode_items(texts)).items]
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu").eval()
    tokenizer = write_tokenizer(tmp_path / "reference-tokenizer", end_with_eos=True)
    for text, vector in zip(texts, ours, strict=True):
        # the stack on the tokens our tokenizer.json makes (transformers' tokenizer class for gemma3 adds its own)
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            expected = reference({"input_ids": ids, "attention_mask": torch.ones_like(ids)})["sentence_embedding"][0]
        assert float(np.abs(np.asarray(vector) - expected.numpy()).max()) <= TOLERANCE


# (family, config.json `is_causal`, loadtime options, public adapter module, pooling, query and document templates):
# gte-Qwen2-7B-instruct, whose config says it attends both ways, through `sentence_transformer` with last-token pooling;
# GritLM-7B, a causal config the public server runs with `forward_kwargs: {is_causal: false}`, mean pooling over its
# templates (words of the test vocabulary stand for its `<|user|>` and `<|embed|>` markers)
BOTH_WAYS_EMBEDDERS = {
    "gte-qwen2": ("qwen2", False, {}, SENTENCE_TRANSFORMER, "last", "Instruct: {instruction}\nQuery: {text}", None),
    "gritlm": ("mistral", True, {"forward_kwargs": {"is_causal": False}},
               "sie_server.adapters.pytorch_embedding:PyTorchEmbeddingAdapter", "mean",
               "w50\n{instruction}\nw51\n{text}", "w51\n{text}"),
}  # fmt: skip


@pytest.mark.parametrize("recipe", sorted(BOTH_WAYS_EMBEDDERS))
def test_a_decoder_embedder_that_attends_both_ways_equals_transformers(
    recipe: str, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Served through the loader as the public YAMLs configure them, queries and documents of several lengths in one
    batch (longer than the windows): each vector is transformers' bidirectional forward, pooled and normalized."""
    import torch

    family, causal, loadtime, adapter_path, pooling, query_template, doc_template = BOTH_WAYS_EMBEDDERS[recipe]
    config = family_config(family)
    config.is_causal = causal
    base = random_causal_lm(family, config=config).model
    base.save_pretrained(tmp_path / "model")
    tokenizer = write_tokenizer(tmp_path / "model", end_with_eos=True, eos_token="<|endoftext|>")
    runtime = {"pooling": pooling, "normalize": True, "default_instruction": "w7 w8", "query_template": query_template}
    if doc_template:
        runtime["doc_template"] = doc_template
    model = parse_model_config(
        {"sie_id": f"acme/{recipe}", "weights_path": str(tmp_path / "model"), "max_sequence_length": 64,
         "tasks": {"encode": {"dense": {"dim": 32}}},
         "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 1024,
                                  "adapter_options": {"loadtime": loadtime, "runtime": runtime}}}}
    )  # fmt: skip
    loaded = model_loader.load(model, "default", model.sie_id)
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11"]
    for is_query in (True, False):
        results = loaded.adapter.encode(encode_items(texts, is_query=is_query)).items
        template = query_template.replace("{instruction}", "w7 w8") if is_query else (doc_template or "{text}")
        for text, result in zip(texts, results, strict=True):
            assert result.ok, result.error
            ids = torch.tensor([tokenizer.encode(template.replace("{text}", text)).ids])
            with torch.no_grad():
                hidden = base(ids, is_causal=False).last_hidden_state[0].numpy()
            pooled = hidden.mean(0) if pooling == "mean" else hidden[-1]
            expected = pooled / np.linalg.norm(pooled)
            assert float(np.abs(np.asarray(result.result["dense"]["values"]) - expected).max()) <= TOLERANCE


@pytest.mark.parametrize(
    ("forward_kwargs", "named"),
    [({"is_causal": "no"}, "is_causal must be true or false"), ({"use_cache": False}, "['use_cache'] are not"),
     ([1], "must be a mapping")],
)  # fmt: skip
def test_forward_kwargs_the_graph_cannot_honour_fail_the_load_naming_them(
    forward_kwargs: Any, named: str, model_loader: ModelLoader, tmp_path: Path
) -> None:
    save_base_model(tmp_path / "model", "mistral")
    model = parse_model_config(
        {"sie_id": "acme/gritlm", "weights_path": str(tmp_path / "model"), "tasks": {"encode": {"dense": {"dim": 32}}},
         "profiles": {"default": {"adapter_path": "sie_server.adapters.pytorch_embedding:PyTorchEmbeddingAdapter",
                                  "max_batch_tokens": 1024,
                                  "adapter_options": {"loadtime": {"forward_kwargs": forward_kwargs}}}}}
    )  # fmt: skip
    with pytest.raises(ModelLoadError, match="forward_kwargs") as raised:
        model_loader.load(model, "default", model.sie_id)
    assert named in str(raised.value)


def test_append_eos_needs_a_template_post_processor_or_none(model_loader: ModelLoader, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, processors

    save_base_model(tmp_path / "model", "qwen3", end_with_eos=False)
    tokenizer = Tokenizer.from_file(str(tmp_path / "model" / "tokenizer.json"))
    tokenizer.post_processor = processors.ByteLevel()
    tokenizer.save(str(tmp_path / "model" / "tokenizer.json"))
    model = parse_model_config(
        {"sie_id": "acme/eos", "weights_path": str(tmp_path / "model"), "tasks": {"encode": {"dense": {"dim": 32}}},
         "profiles": {"default": {"adapter_path": EMBEDDERS["mistral"][0], "max_batch_tokens": 1024,
                                  "adapter_options": {"loadtime": {"append_eos": True}}}}}
    )  # fmt: skip
    with pytest.raises(ModelLoadError, match="append_eos: cannot append '<|endoftext|>': the post-processor is a"):
        model_loader.load(model, "default", model.sie_id)


@pytest.mark.parametrize(
    ("model_type", "named"),
    [("qwen3_moe", "qwen3_moe"), ("gemma3n", "gemma3n"), ("qwen3_vl", "qwen3_vl")],
)
def test_a_decoder_that_is_not_built_fails_its_load_naming_it(
    model_type: str, named: str, model_loader: ModelLoader, tmp_path: Path
) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 32}))
    (directory / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    write_tokenizer(directory)
    with pytest.raises(ModelLoadError, match=named):
        model_loader.load(generation_yaml(directory, model_type), "default", f"acme/{model_type}-chat")


RERANK_CONTEXT = 120
RERANKER = "sie_server.adapters.qwen2_flash_cross_encoder.adapter:Qwen2FlashCrossEncoderAdapter"
QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def qwen3_card_ids(tokenizer: Any, instruction: str, query: str, document: str, room: int) -> list[int]:
    """Qwen3-Reranker's model card: prefix tokens + the formatted pair's tokens (cut to `room`) + suffix tokens."""
    middle = tokenizer.encode(f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}").ids
    return tokenizer.encode(QWEN3_PREFIX).ids + middle[:room] + tokenizer.encode(QWEN3_SUFFIX).ids


MXBAI_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your binary "
    "relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:"
)


def mxbai_ids(tokenizer: Any, query: str, document: str, context: int) -> list[int]:
    """mxbai-rerank-v2's format, its parts tokenized one by one; the document cut to what the context leaves."""

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text).ids

    head = ids(MXBAI_SYSTEM + "<|im_start|>user\n") + ids(f"query: {query}") + ids("\n")
    tail = ids("\n") + ids(MXBAI_TASK) + ids("<|im_end|>\n<|im_start|>assistant\n")
    return head + ids(f"document: {document}")[: context - len(head) - len(tail)] + tail


def load_reranker(model_loader: ModelLoader, weights: Path, adapter_path: str, loadtime: dict[str, Any],
                  precision: str | None = None) -> Any:  # fmt: skip
    """A decoder reranker over the checkpoint at `weights`, through the public module `adapter_path`, its profile's
    compute_precision `precision`."""
    entry = parse_model_config(
        {
            "sie_id": "acme/decoder-rerank",
            "weights_path": str(weights),
            "max_sequence_length": RERANK_CONTEXT,
            "tasks": {"score": {}},
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 4096,
                                     "compute_precision": precision,
                                     "adapter_options": {"loadtime": loadtime, "runtime": {}}}},
        }
    )  # fmt: skip
    return model_loader.load(entry, "default", entry.sie_id)


def reranker_scores(loaded: Any, query: str, documents: list[str]) -> dict[str, float]:
    """The adapter's score of each document for `query`, by item id (`item-{index}`)."""
    item = SimpleNamespace(query_item={"text": query}, score_items=[{"text": d} for d in documents], options=None,
                           instruction=None)  # fmt: skip
    (result,) = loaded.adapter.score([item]).items
    assert result.ok, result.error
    return {row["item_id"]: row["score"] for row in result.result}


# (family, loadtime options, how the reference builds a pair's ids, [no, yes] words, score of the two logits)
RERANKERS = {
    # Qwen3-Reranker's YAML; a tied output head
    "qwen3": ("qwen3", {"yes_token": "yes", "no_token": "no", "input_format": "qwen3", "score_mode": "log_softmax",
                        "default_instruction": "w9 w10"}, ("no", "yes")),
    # mxbai-rerank-v2's YAML (no options: its format, "1"/"0" and yes − no are the defaults); an untied head
    "mxbai": ("qwen2", {}, ("0", "1")),
    # Qwen3-Reranker's recipe on a Qwen3.5 (the pairs' last hidden states through linear-attention layers)
    "qwen3_5": ("qwen3_5", {"yes_token": "yes", "no_token": "no", "input_format": "qwen3", "score_mode": "log_softmax",
                            "default_instruction": "w9 w10"}, ("no", "yes")),
}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(RERANKERS))
def test_a_decoder_reranker_scores_as_its_model_card_computes(
    variant: str, model_loader: ModelLoader, gpu_loader: ModelLoader, tmp_path: Path
) -> None:
    import torch

    family, loadtime, (no_word, yes_word) = RERANKERS[variant]
    model = save_causal_lm(tmp_path / "model", family)
    loaded = load_reranker(model_loader, tmp_path / "model", RERANKER, loadtime)
    tokenizer = write_tokenizer(tmp_path / "reference-tokenizer")
    no_id, yes_id = tokenizer.token_to_id(no_word), tokenizer.token_to_id(yes_word)
    query, documents = "w1 w2 w3", ["w4 w5", "w6", " ".join(f"w{i % 50}" for i in range(80))]  # the last one is cut
    scores = reranker_scores(loaded, query, documents)
    qwen3_format = loadtime.get("input_format") == "qwen3"
    for index, document in enumerate(documents):
        if qwen3_format:
            fixed = len(tokenizer.encode(QWEN3_PREFIX).ids) + len(tokenizer.encode(QWEN3_SUFFIX).ids)
            ids = qwen3_card_ids(tokenizer, "w9 w10", query, document, RERANK_CONTEXT - fixed)
        else:
            ids = mxbai_ids(tokenizer, query, document, RERANK_CONTEXT)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1, [no_id, yes_id]]
        expected = torch.log_softmax(logits, -1)[1].exp().item() if qwen3_format else (logits[1] - logits[0]).item()
        assert abs(scores[f"item-{index}"] - expected) <= TOLERANCE
    assert len(loaded.adapter.pair_ids(query, documents[2], None)) == RERANK_CONTEXT
    # a GPU loader's picks each pair's last hidden state on the device (whose sessions run on the CPU provider here)
    on_device = load_reranker(gpu_loader, tmp_path / "model", RERANKER, loadtime, precision="float32")
    assert on_device.adapter._device_pooling is not None and loaded.adapter._device_pooling is None
    assert reranker_scores(on_device, query, documents) == pytest.approx(scores, abs=1e-6)


NATIVE_RERANKER = "sie_server.adapters.native_causal_cross_encoder.adapter:NativeCausalCrossEncoderAdapter"
NATIVE_ROW = "<|im_start|>system\n{query}<|im_end|>\n<|im_start|>user\n{document}<|im_end|>\n<|im_start|>assistant\n"


def test_a_native_causal_reranker_scores_with_its_positive_tokens_raw_logit(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    """zerank's public module (`native_causal_cross_encoder`): the query as the system turn, the document as the user
    turn, the row tokenized whole, the score the raw logit of one token (zerank's 9454; here the tiny vocabulary's
    "yes", named by `score_token_id`), equal to transformers' logits at the last position."""
    import torch

    model = save_causal_lm(tmp_path / "model", "qwen3")
    tokenizer = write_tokenizer(tmp_path / "reference-tokenizer")
    yes_id = tokenizer.token_to_id("yes")
    loaded = load_reranker(model_loader, tmp_path / "model", NATIVE_RERANKER, {"score_token_id": yes_id})
    assert (loaded.adapter.input_format, loaded.adapter.score_mode) == ("native", "logit")  # the module's defaults
    query, documents = "w1 w2 w3", ["w4 w5", "w6", "w7 w8 w9 w10"]
    scores = reranker_scores(loaded, query, documents)
    for index, document in enumerate(documents):
        ids = tokenizer.encode(NATIVE_ROW.format(query=query, document=document)).ids
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, -1, yes_id].item()
        assert abs(scores[f"item-{index}"] - expected) <= TOLERANCE
    too_long = SimpleNamespace(query_item={"text": query}, score_items=[{"text": "w1 " * RERANK_CONTEXT}],
                               options=None, instruction=None)  # fmt: skip
    (refused,) = loaded.adapter.score([too_long]).items
    assert not refused.ok and "over the model's" in refused.error


def test_a_gpu_loader_converts_float16_weights_and_cache(model_loader: ModelLoader, tmp_path: Path) -> None:
    """A loader for a CUDA device converts a checkpoint into float16 graphs (weights, products and cache; norms,
    softmax and logits in float32) unless the profile's compute_precision is float32; onnxruntime's CPU provider
    runs them too, so they are checked here against transformers in float32 within float16's precision."""
    import torch

    model = save_causal_lm(tmp_path / "model", "qwen3")
    gpu_loader = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0"))
    files = gpu_loader.prepare(generation_yaml(tmp_path / "model", "qwen3"), "default", "acme/qwen3-chat")
    config = json.loads((files.model_dir / "config.json").read_text())
    assert config["torch_dtype"] == "float16"
    assert files.precision == "float16"  # what /v1/models shows under loaded_on
    graph = session(files.graph)
    assert {i.type for i in graph.get_inputs() if i.name.startswith("past_key_values.")} == {"tensor(float16)"}
    prompt = list(range(4, 4 + LENGTHS[0]))
    for seen, logits in run_generation_graph(graph, CacheShape.from_config(config), [prompt], 3):
        assert float(np.abs(logits[0] - reference_logits(model, seen[0])).max()) <= 3e-2
    embedder = parse_model_config(
        {"sie_id": "acme/qwen3-embed", "weights_path": str(tmp_path / "model"),
         "tasks": {"encode": {"dense": {"dim": 32}}},
         "profiles": {"default": {"adapter_path": EMBEDDERS["qwen3"][0], "max_batch_tokens": 1024}}}
    )  # fmt: skip
    hidden_files = gpu_loader.prepare(embedder, "default", embedder.sie_id)
    hidden_graph = hidden_files.graph
    assert hidden_files.precision == "float16" and model_loader.prepare(embedder, "default", "e").precision == "float32"
    ids = np.asarray([prompt])
    (hidden,) = session(hidden_graph).run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    with torch.no_grad():
        expected = model.model(torch.from_numpy(ids)).last_hidden_state.numpy()
    assert hidden.dtype == np.float32 and float(np.abs(hidden - expected).max()) <= 3e-2
    # a profile whose compute_precision is float32 keeps float32 on the GPU too
    exact = parse_model_config(
        {"sie_id": "acme/qwen3-exact", "weights_path": str(tmp_path / "model"), "tasks": {"generate": {}},
         "profiles": {"default": {"adapter_path": "sie.adapters.causal_lm:OnnxCausalLMAdapter",
                                  "max_batch_tokens": 1024, "compute_precision": "float32"}}}
    )  # fmt: skip
    exact_files = gpu_loader.prepare(exact, "default", exact.sie_id)
    assert json.loads((exact_files.model_dir / "config.json").read_text())["torch_dtype"] == "float32"
    assert exact_files.precision == "float32"


def test_a_qwen3_5_float16_graph_keeps_its_linear_attention_states_in_float32(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    """On a GPU a hybrid decoder's keys and values are float16 like any decoder's, its convolution and recurrent states
    float32 (the delta rule runs in float32, as transformers runs it); the graph follows transformers within float16's
    precision, step by step through both caches."""
    model = save_causal_lm(tmp_path / "model", "qwen3_5")
    gpu_loader = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0"))
    files = gpu_loader.prepare(generation_yaml(tmp_path / "model", "qwen3_5"), "default", "acme/qwen3_5-chat")
    config = json.loads((files.model_dir / "config.json").read_text())
    graph = session(files.graph)
    types = {i.name.rsplit(".", 1)[1]: i.type for i in graph.get_inputs() if i.name.startswith("past_key_values.")}
    assert types == {"key": "tensor(float16)", "value": "tensor(float16)", "conv": "tensor(float)",
                     "recurrent": "tensor(float)"}  # fmt: skip
    prompt = list(range(4, 4 + LENGTHS[0]))
    for seen, logits in run_generation_graph(graph, CacheShape.from_config(config), [prompt], 3):
        assert float(np.abs(logits[0] - reference_logits(model, seen[0])).max()) <= 3e-2


def test_a_gemma4_float16_graph_caches_its_own_layers_only_and_follows_transformers(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Gemma 4 on a GPU (float16 where its profile names it, as for Gemma 3): a float16 cache per layer that computes
    its keys and values, in that layer's shape (the full-attention layers' heads twice as wide), none for the layers
    that read an earlier one's; the graph follows transformers within float16's precision, step by step."""
    model = save_causal_lm(tmp_path / "model", "gemma4")
    entry = parse_model_config(
        {"sie_id": "acme/gemma4-chat", "weights_path": str(tmp_path / "model"), "tasks": {"generate": {}},
         "profiles": {"default": {"adapter_path": "sie_server.adapters.sglang.gemma:SGLangGemmaAdapter",
                                  "max_batch_tokens": 1024, "compute_precision": "float16"}}}
    )  # fmt: skip
    gpu_loader = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0"))
    files = gpu_loader.prepare(entry, "default", entry.sie_id)
    config = json.loads((files.model_dir / "config.json").read_text())
    graph = session(files.graph)
    caches = {i.name: (i.type, i.shape[1], i.shape[3]) for i in graph.get_inputs() if i.name.endswith(".key")}
    assert caches == {f"past_key_values.{layer}.key": ("tensor(float16)", 2, 16 if layer % 2 else 8)
                      for layer in range(4)}  # fmt: skip
    prompt = list(range(4, 4 + LENGTHS[0]))
    for seen, logits in run_generation_graph(graph, CacheShape.from_config(config), [prompt], 3):
        assert float(np.abs(logits[0] - reference_logits(model, seen[0])).max()) <= 3e-2


def test_a_checkpoint_over_the_memory_budget_is_refused_before_it_is_converted(
    model_loader: ModelLoader, tmp_path: Path
) -> None:
    save_causal_lm(tmp_path / "model", "qwen3")
    parameters = 64 * 32 + 2 * (32 * (4 * 12 + 2 * 2 * 12) + 4 * 12 * 32 + 3 * 32 * 48 + 2 * 32 + 2 * 12) + 32
    small = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(), memory_budget_bytes=4 * 1024)
    with pytest.raises(ModelLoadError, match=f"has {parameters:,} parameters: {4 * parameters:,} bytes in float32, "
                                             "more than this worker's memory budget of 4,096 bytes"):  # fmt: skip
        small.load(generation_yaml(tmp_path / "model", "qwen3"), "default", "acme/qwen3-chat")
    assert not (tmp_path / "converted").exists()  # nothing was converted
    roomy = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(), memory_budget_bytes=10**9)
    loaded = roomy.load(generation_yaml(tmp_path / "model", "qwen3"), "default", "acme/qwen3-chat")
    try:
        assert loaded.memory_bytes >= 4 * parameters  # the graph's weights are counted
    finally:
        loaded.close()


def test_graph_bytes_count_an_external_tensor_file(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"x" * 10)
    assert graph_bytes(tmp_path / "model.onnx") == 10
    (tmp_path / "model.onnx.data").write_bytes(b"x" * 1000)
    assert graph_bytes(tmp_path / "model.onnx") == 1010


@pytest.mark.parametrize(
    ("requested", "expected"), [(None, "float32"), ("bfloat16", "float32"), ("float16", "float16")]
)
def test_gemma_stays_float32_on_a_gpu_unless_a_profile_names_float16(
    requested: str | None, expected: str, model_loader: ModelLoader, tmp_path: Path
) -> None:
    """Gemma 3's activations overflow float16 (its model cards allow float32 or bfloat16)."""
    save_base_model(tmp_path / "model", "gemma3")
    profile = {"adapter_path": SENTENCE_TRANSFORMER, "max_batch_tokens": 1024, "compute_precision": requested}
    model = parse_model_config(
        {"sie_id": "acme/gemma-embed", "weights_path": str(tmp_path / "model"),
         "tasks": {"encode": {"dense": {"dim": 32}}}, "profiles": {"default": profile}}
    )  # fmt: skip
    gpu_loader = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0"))
    graph = gpu_loader.prepare(model, "default", model.sie_id).graph
    assert graph.name == f"{decoder_cache_key(tmp_path / 'model', 'hidden', expected)}.onnx"


# llama.cpp's tensor names for the llama and qwen architectures (convert_hf_to_gguf's mapping)
GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
              "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
              "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
              "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}  # fmt: skip


def write_decoder_gguf(
    model: Any, architecture: str, path: Path, pre: str = "qwen2", extra_tensors: dict[str, np.ndarray] | None = None
) -> Path:
    """`model` (a transformers Llama/Qwen2/Qwen3 causal LM over llama_reference's byte-level vocabulary) as llama.cpp
    writes it: its numbers under `{architecture}.*`, the vocabulary with the `pre` pre-tokenizer, the tensors (a
    llama file's q and k rows permuted for llama.cpp's rotation), and `extra_tensors`."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    llama_reference.add_decoder_numbers(writer, config)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_key_length(
        config.head_dim if architecture == "qwen3" else config.hidden_size // config.num_attention_heads
    )
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    tokens = llama_reference.vocabulary()
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in llama_reference.SPECIALS else 1 for token in tokens])
    writer.add_token_merges(list(llama_reference.MERGES))
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        rest = ""
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            stored = f"blk.{index}.{GGUF_LAYER[rest]}"
        else:
            stored = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                      "lm_head.weight": "output.weight"}[name]  # fmt: skip
        array = tensor.numpy()
        if architecture == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            heads = config.num_attention_heads if rest.startswith("self_attn.q") else config.num_key_value_heads
            array = llama_reference.llama_cpp_permute(array, heads)
        writer.add_tensor(stored, array)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_qwen_gguf_converts_to_the_checkpoints_decoder_and_tokenizer(family: str, tmp_path: Path) -> None:
    import transformers

    base = {**COMMON, "vocab_size": llama_reference.VOCAB}
    config = transformers.Qwen2Config(**base) if family == "qwen2" else transformers.Qwen3Config(**base, head_dim=12)
    model = random_causal_lm(family, config=config)
    model.save_pretrained(tmp_path / "checkpoint")
    from_gguf = convert_gguf(write_decoder_gguf(model, family, tmp_path / "tiny.gguf"), tmp_path / "from-gguf")
    from_checkpoint = convert_decoder_checkpoint(tmp_path / "checkpoint", tmp_path / "from-checkpoint")
    assert_same_decoder(from_gguf, from_checkpoint, model)
    # the rebuilt tokenizer splits as transformers' Qwen2 tokenizer does over the same vocabulary and merges
    tokens = llama_reference.vocabulary()
    reference = transformers.Qwen2Tokenizer(vocab={token: index for index, token in enumerate(tokens)},
                                            merges=[tuple(m.split(" ")) for m in llama_reference.MERGES])  # fmt: skip
    reference.add_tokens([AddedToken(token, special=True) for token in llama_reference.SPECIALS])
    rebuilt = Tokenizer.from_file(str(from_gguf.directory / "tokenizer.json"))
    for text in ["the cat in a hat", "Year 2025: 12345 apples!", "line one\n\n  line two\tend", "café ｃafé e\u0301",
                 "it's we'll THEY'VE", "<|im_start|>user hi<|im_end|>"]:  # fmt: skip
        assert rebuilt.encode(text).ids == reference(text)["input_ids"], text


def llama_cpp_rope_factors(config: Any) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for a `llama3` RoPE scaling: per pair of head dimensions,
    1 for the high frequencies, the factor for the low ones, and the smooth blend between."""
    scaling, theta = config.rope_parameters, config.rope_parameters["rope_theta"]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    dim = config.hidden_size // config.num_attention_heads
    factors = []
    for frequency in 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim):
        wavelength = 2 * math.pi / frequency
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def test_a_llama3_gguf_converts_with_its_rope_factors(tmp_path: Path) -> None:
    """Llama 3.1's RoPE scaling, which llama.cpp stores as the `rope_freqs` tensor: the GGUF converts to the
    checkpoint's decoder."""
    import transformers

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}  # fmt: skip
    config = transformers.LlamaConfig(**{**COMMON, "vocab_size": llama_reference.VOCAB}, rope_theta=500.0,
                                      rope_scaling=rope)  # fmt: skip
    model = random_causal_lm("llama", config=config)
    model.save_pretrained(tmp_path / "checkpoint")
    factors = llama_cpp_rope_factors(model.config)
    # the pairs of a 8-wide head: one spared, one blended, two scaled by the whole factor
    assert factors[0] == 1.0 and 1.0 < factors[1] < 8.0 and list(factors[2:]) == [8.0, 8.0]
    path = write_decoder_gguf(model, "llama", tmp_path / "tiny.gguf", pre="llama-bpe",
                              extra_tensors={"rope_freqs.weight": factors})  # fmt: skip
    from_gguf = convert_gguf(path, tmp_path / "from-gguf")
    from_checkpoint = convert_decoder_checkpoint(tmp_path / "checkpoint", tmp_path / "from-checkpoint")
    assert_same_decoder(from_gguf, from_checkpoint, model)


# How each pre-tokenizer splits "1234567 ABCdef", beside transformers' GGUF tokenizer on the same file (qwen2 is
# checked against transformers' Qwen2 tokenizer above: its NFC normaliser, which transformers' GGUF path leaves out)
PRE_TOKENIZER_SPLITS = {
    "llama-bpe": ["123", "456", "7", "ĠABCdef"],  # Llama 3: digit runs of up to three
    "tekken": ["1", "2", "3", "4", "5", "6", "7", "ĠABCdef"],  # Mistral's Tekken: digits one by one
}


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZER_SPLITS))
def test_a_byte_level_gguf_tokenizer_splits_as_transformers_gguf_tokenizer(pre: str, tmp_path: Path) -> None:
    import transformers

    config = transformers.LlamaConfig(**{**COMMON, "vocab_size": llama_reference.VOCAB})
    path = write_decoder_gguf(random_causal_lm("llama", config=config), "llama", tmp_path / "tiny.gguf", pre=pre)
    rebuilt = Tokenizer.from_file(str(convert_gguf(path, tmp_path / "converted").directory / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    for text in ["the cat in a hat", "Year 2025: 12345 apples!", "line one\n\n  line two\tend", "café ｃafé e\u0301",
                 "it's we'll THEY'VE", "HTTPServer getURL iPhone", "a/b\r\nc", "<|im_start|>user hi<|im_end|>",
                 "  ", ""]:  # fmt: skip
        theirs = reference(text, add_special_tokens=False)["input_ids"]
        assert rebuilt.encode(text, add_special_tokens=False).ids == theirs, text
    split = [piece for piece, _ in rebuilt.pre_tokenizer.pre_tokenize_str("1234567 ABCdef")]
    assert split == PRE_TOKENIZER_SPLITS[pre]
