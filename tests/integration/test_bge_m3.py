"""BGE-M3 served as FlagEmbedding's BGEM3FlagModel computes it, on a tiny random XLM-R checkpoint saved by
transformers with its two heads saved by `torch.save` (`sparse_linear.pt`, `colbert_linear.pt`), as the Hub's
BAAI/bge-m3 ships them, and the public catalogue's profile (`bge_m3_flash`, pooling cls). The reference is
transformers' XLM-R with the heads applied by torch as `BGEM3Model` does (`_dense_embedding` cls, `_sparse_embedding`
relu + `_process_token_weights`, `_colbert_embedding` + `_process_colbert_vecs`); ours is the worker's adapter on a
padded batch (≤ 1e-4). torch and transformers are imported inside the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.device_pooling import DeviceTokenStates
from sie.worker.errors import ModelLoadError
from support.encoder_checkpoints import BGE_M3_COLBERT_DIM, HIDDEN, VOCAB, bge_m3_reference, save_bge_m3
from support.worker_items import encode_items

COLBERT_DIM = BGE_M3_COLBERT_DIM
# Repeated words: a token id whose occurrences weigh differently shows the max is taken, not the sum.
TEXTS = ["w1 w2 w3 w1 w2 w1", "w4", "w5 w6 w7 w8 w9 w10 w11 w5 w5 w6"]


def model_yaml(directory: Path, multivector_dim: int = COLBERT_DIM) -> Any:
    return parse_model_config(
        {
            "sie_id": "acme/bge-m3",
            "weights_path": str(directory),
            "max_sequence_length": 32,
            "tasks": {"encode": {"dense": {"dim": HIDDEN}, "sparse": {"dim": VOCAB},
                                 "multivector": {"dim": multivector_dim}}, "score": {}},
            "profiles": {"default": {"adapter_path": "sie_server.adapters.bge_m3_flash:BGEM3FlashAdapter",
                                     "max_batch_tokens": 512,
                                     "adapter_options": {"runtime": {"pooling": "cls", "normalize": True}}}},
        }
    )  # fmt: skip


# A GPU loader's adapter keeps the token states on the device (the device is the seam: its sessions run on the CPU
# provider here, tests/integration/conftest.py), pools the dense vectors and runs both heads there: the token states
# themselves never reach the host.
LOADERS = ["model_loader", "gpu_loader"]


@pytest.mark.parametrize("loader", LOADERS)
def test_dense_sparse_and_multivector_equal_bge_m3s_own_math(
    loader: str, request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizers import Tokenizer

    model, sparse, colbert = save_bge_m3(tmp_path)
    config = model_yaml(tmp_path)
    loaded = request.getfixturevalue(loader).load(config, "default", config.sie_id)
    assert (loaded.adapter._device_pooling is not None) == (loader == "gpu_loader")
    monkeypatch.setattr(DeviceTokenStates, "to_host", lambda states: pytest.fail("token states copied to the host"))
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    results = loaded.adapter.encode(encode_items(TEXTS, output_types=["dense", "sparse", "multivector"])).items
    expected_all = [bge_m3_reference(model, sparse, colbert, tokenizer.encode(text).ids) for text in TEXTS]
    assert sum(expected["repeated"] for expected in expected_all) > 0  # some id weighs twice: max, not sum
    for text, result in zip(TEXTS, results, strict=True):
        assert result.ok, result.error
        expected = bge_m3_reference(model, sparse, colbert, tokenizer.encode(text).ids)
        assert float(np.abs(np.asarray(result.result["dense"]["values"]) - expected["dense"]).max()) <= 1e-4
        ours_sparse = result.result["sparse"]
        assert ours_sparse["dims"] == VOCAB
        assert list(ours_sparse["indices"]) == sorted(expected["sparse"])
        assert np.allclose(ours_sparse["values"], [expected["sparse"][i] for i in sorted(expected["sparse"])],
                           atol=1e-4)  # fmt: skip
        vectors = np.asarray(result.result["multivector"]["values"])
        assert vectors.shape == expected["multivector"].shape
        assert float(np.abs(vectors - expected["multivector"]).max()) <= 1e-4


@pytest.mark.parametrize("loader", LOADERS)
def test_each_output_alone_and_dense_scoring(
    loader: str, request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_bge_m3(tmp_path)
    config = model_yaml(tmp_path)
    loaded = request.getfixturevalue(loader).load(config, "default", config.sie_id)
    heads: list[str] = []
    through_head = DeviceTokenStates.through_head
    monkeypatch.setattr(DeviceTokenStates, "through_head", lambda states, head: heads.append(head)
                        or through_head(states, head))  # fmt: skip
    (only_sparse,) = loaded.adapter.encode(encode_items(TEXTS[:1], output_types=["sparse"])).items
    assert set(only_sparse.result) == {"sparse"}
    assert heads == (["sparse"] if loader == "gpu_loader" else [])  # the head asked for, alone
    encoded = loaded.adapter.encode(encode_items(TEXTS, output_types=["dense"])).items
    assert heads == (["sparse"] if loader == "gpu_loader" else [])  # dense alone: pooled, no head run
    dense = [np.asarray(result.result["dense"]["values"]) for result in encoded]
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": TEXTS[0]}, score_items=[{"text": t} for t in TEXTS[1:]])  # fmt: skip
    (scored,) = loaded.adapter.score([item]).items
    scores = {row["item_id"]: row["score"] for row in scored.result}
    for index, vector in enumerate(dense[1:]):
        assert scores[f"item-{index}"] == pytest.approx(float(vector @ dense[0]), abs=1e-4)


def test_a_checkpoint_without_its_heads_fails_the_load_naming_them(model_loader, tmp_path: Path) -> None:
    save_bge_m3(tmp_path)
    (tmp_path / "colbert_linear.pt").unlink()
    config = model_yaml(tmp_path)
    with pytest.raises(ModelLoadError, match=r"BGE-M3 head colbert_linear.pt is not in"):
        model_loader.load(config, "default", config.sie_id)


def test_a_colbert_head_of_another_width_than_the_yaml_fails_the_load(model_loader, tmp_path: Path) -> None:
    save_bge_m3(tmp_path)
    config = model_yaml(tmp_path, multivector_dim=HIDDEN)
    with pytest.raises(ModelLoadError, match=rf"{COLBERT_DIM}-dimensional multivector vectors"):
        model_loader.load(config, "default", config.sie_id)
