"""MUVERA encodings (`sie.worker.muvera`) against the public SIE server's own MuveraPostprocessor, imported from the
sie-server 0.10.1 wheel (`make test` downloads it; its module needs numpy alone): the same vectors for queries and
documents under each setting the catalogue uses (the text ColBERTs' AMS projection to 8 without a final sketch, the
defaults' full width with a Count Sketch), centring and normalisation; and the settings that cannot be built are
refused by name."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from sie.worker import muvera
from sie.worker.muvera import Muvera, MuveraConfig, MuveraConfigError

TOKEN_DIM = 16


@pytest.fixture(scope="module")
def public(public_wheel: Path) -> ModuleType:
    wheel = str(public_wheel)
    sys.path.append(wheel)  # zipimport: the wheel's pure-Python modules, after everything installed
    try:
        import sie_server.core.postprocessor as postprocessor  # noqa: PLC0415 - the reference, from the wheel
    finally:
        sys.path.remove(wheel)
    return postprocessor


def public_encodings(public: ModuleType, settings: dict[str, Any], texts: list[np.ndarray], is_query: bool):
    from sie_server.core.inference_output import EncodeOutput  # noqa: PLC0415 - imported with the fixture's module

    processor = public.MuveraPostprocessor(token_dim=TOKEN_DIM, config=public.MuveraConfig(**settings))
    output = EncodeOutput(batch_size=len(texts), multivector=texts)
    processor.transform(output, is_query=is_query)
    return processor.target_dim, output.dense


SETTINGS = {
    # the public catalogue's text ColBERTs: AMS to 8 per partition, no final sketch
    "ams-8": {"num_repetitions": 5, "num_simhash_projections": 3, "projection_dim": 8, "final_projection_dim": None},
    # the defaults' shape: full token width, a Count Sketch folding it
    "count-sketch": {"num_repetitions": 4, "num_simhash_projections": 4, "final_projection_dim": 100},
    "centred-normalised": {"num_repetitions": 3, "num_simhash_projections": 2, "projection_dim": 4,
                           "final_projection_dim": 20, "center_tokens": True, "normalize": True, "seed": 7},
    # a final sketch no smaller than the concatenation is skipped
    "sketch-skipped": {"num_repetitions": 2, "num_simhash_projections": 2, "projection_dim": 4,
                       "final_projection_dim": 10_000},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("is_query", [True, False], ids=["query", "document"])
def test_encodings_equal_the_public_servers(public: ModuleType, name: str, is_query: bool) -> None:
    rng = np.random.default_rng(3)
    texts = [rng.standard_normal((count, TOKEN_DIM)).astype(np.float32) for count in (1, 5, 33)]
    texts.append(np.zeros((0, TOKEN_DIM), dtype=np.float32))  # no tokens: zeros
    texts = [text / np.maximum(np.linalg.norm(text, axis=1, keepdims=True), 1e-12) for text in texts]
    dim, expected = public_encodings(public, SETTINGS[name], texts, is_query)
    encoder = Muvera(TOKEN_DIM, MuveraConfig.read(SETTINGS[name]))
    assert encoder.dim == dim
    ours = np.stack([encoder.encode(text, is_query) for text in texts])
    assert ours.shape == expected.shape and ours.dtype == np.float32
    assert float(np.abs(ours - expected).max()) <= 1e-5
    assert not ours[-1].any()
    assert float(np.abs(ours[:-1]).max()) > 0.01  # the comparison is of something


def test_a_long_text_in_chunks_of_repetitions_encodes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = np.random.default_rng(5).standard_normal((40, TOKEN_DIM)).astype(np.float32)
    for name in ("ams-8", "count-sketch"):
        encoder = Muvera(TOKEN_DIM, MuveraConfig.read(SETTINGS[name]))
        whole = encoder.encode(tokens, is_query=False)
        with monkeypatch.context() as patch:
            patch.setattr(muvera, "ONE_HOT_CELLS", 100)  # one repetition per product
            chunked = encoder.encode(tokens, is_query=False)
        np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-6)


def test_the_defaults_are_the_public_servers(public: ModuleType) -> None:
    config = MuveraConfig.read(None)
    theirs = public.MuveraConfig()
    assert (config.num_repetitions, config.num_simhash_projections, config.projection_dim,
            config.final_projection_dim, config.seed, config.normalize, config.center_tokens) == (
        theirs.num_repetitions, theirs.num_simhash_projections, theirs.projection_dim, theirs.final_projection_dim,
        theirs.seed, theirs.normalize, theirs.center_tokens)  # fmt: skip
    assert Muvera(128, config).dim == 10240


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"repetitions": 4}, "['repetitions'] are not known"),
        ({"num_repetitions": 0}, "num_repetitions must be a whole number of at least 1"),
        ({"projection_dim": 2.5}, "projection_dim must be a whole number"),
        ({"normalize": "yes"}, "normalize must be true or false"),
        ({"num_simhash_projections": 30}, "num_simhash_projections is at most 16"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_a_setting_that_cannot_be_built_is_refused_by_name(settings: Any, named: str) -> None:
    with pytest.raises(MuveraConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        MuveraConfig.read(settings)


def test_an_encoding_too_wide_to_serve_is_refused() -> None:
    config = MuveraConfig.read({"num_repetitions": 1000, "num_simhash_projections": 10, "final_projection_dim": 64})
    with pytest.raises(MuveraConfigError, match="dimensions before the final projection"):
        Muvera(128, config)
