"""ColBERT models as their checkpoints were trained to be run, compared with transformers on the same checkpoint.

Two layouts, both as the public catalogue's YAMLs configure them: a Stanford checkpoint (ColBERT v2,
answerai-colbert: a BERT under `bert.` with the projection as a root `linear.weight`, `[unused0]`/`[unused1]`
markers, queries expanded with `[MASK]` by the public `colbert` module) and a PyLate stack (GTE-ModernColBERT: a
ModernBERT, a Dense module in `modules.json`, `[Q] `/`[D] ` markers as added tokens, no expansion, a punctuation
skiplist for documents). The reference runs the transformers model on each text alone, with the marker after the
first token and the expansion unattended, projects and normalises with torch, and keeps the positions PyLate keeps;
ours is the worker's adapter on a batch (≤ 1e-4). torch and transformers are imported inside the tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.device_pooling import DeviceTokenStates
from sie.worker.errors import ModelLoadError
from support.worker_items import encode_items

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = [*SPECIALS, "[unused0]", "[unused1]", *(f"w{index}" for index in range(40)), ".", ",", "!", "?"]
PUNCTUATION_IDS = {VOCAB.index(mark) for mark in ".,!?"}
HIDDEN, TOKEN_DIM = 32, 8
QUERIES = ["w1 w2, w3", "w4"]
DOCS = ["w5. w6 w7! w8", "w9 w10", "w11 , w12 w13 w14 w15 w16 w17 w18 w19 w20 w21 w22"]


def write_tokenizer(directory: Path, markers: list[str]) -> Tokenizer:
    """A word-level BERT-style tokenizer (punctuation split off), with `markers` as added tokens."""
    vocab = {token: index for index, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.add_tokens([AddedToken(marker, normalized=False) for marker in markers])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer


def random_encoder(family: str, vocab_size: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(3)
    sizes = {"hidden_size": HIDDEN, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
             "vocab_size": vocab_size, "max_position_embeddings": 64, "pad_token_id": 0}  # fmt: skip
    if family == "bert":
        config = transformers.BertConfig(**sizes)
    else:
        config = transformers.ModernBertConfig(**sizes | {"num_hidden_layers": 3}, local_attention=4)
    model = transformers.AutoModel.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return model


def save_stanford(directory: Path) -> tuple[Any, np.ndarray]:
    """ColBERT v2's layout: `bert.`-prefixed encoder and a root `linear.weight` in one model.safetensors."""
    import torch
    from safetensors.torch import save_file

    tokenizer = write_tokenizer(directory, [])
    model = random_encoder("bert", tokenizer.get_vocab_size())
    projection = torch.randn(TOKEN_DIM, HIDDEN, generator=torch.Generator().manual_seed(4))
    tensors = {f"bert.{name}": tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file({**tensors, "linear.weight": projection}, str(directory / "model.safetensors"))
    config = model.config.to_dict() | {"architectures": ["HF_ColBERT"]}
    (directory / "config.json").write_text(json.dumps(config))
    return model, projection.numpy()


def save_pylate(directory: Path) -> tuple[Any, np.ndarray]:
    """PyLate's layout: the encoder saved by transformers, then a Dense module listed in modules.json."""
    import torch
    from safetensors.torch import save_file

    tokenizer = write_tokenizer(directory, ["[Q] ", "[D] "])
    model = random_encoder("modernbert", tokenizer.get_vocab_size())
    model.save_pretrained(directory)
    projection = torch.randn(TOKEN_DIM, HIDDEN, generator=torch.Generator().manual_seed(5))
    (directory / "1_Dense").mkdir()
    save_file({"linear.weight": projection}, str(directory / "1_Dense" / "model.safetensors"))
    dense = {"in_features": HIDDEN, "out_features": TOKEN_DIM, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}  # fmt: skip
    (directory / "1_Dense" / "config.json").write_text(json.dumps(dense))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    return model, projection.numpy()


# The public catalogue's profiles for the two layouts (colbertv2.0 and GTE-ModernColBERT-v1), with small limits.
STANFORD_PROFILE = {
    "adapter_path": "sie_server.adapters.colbert:ColBERTAdapter",
    "adapter_options": {
        "loadtime": {"token_dim": TOKEN_DIM, "normalize": True, "query_max_length": 32, "skip_special_tokens": False,
                     "query_prefix": "[unused0]", "doc_prefix": "[unused1]", "doc_punctuation_skiplist": True},
        "runtime": {"query_max_length": 8, "max_seq_length": 12},
    },
}  # fmt: skip
PYLATE_PROFILE = {
    "adapter_path": "sie_server.adapters.colbert_modernbert_flash.adapter:ColBERTModernBERTFlashAdapter",
    "adapter_options": {
        "loadtime": {"token_dim": TOKEN_DIM, "normalize": True, "query_max_length": 64, "skip_special_tokens": False,
                     "query_prefix": "[Q] ", "doc_prefix": "[D] ", "doc_punctuation_skiplist": True},
        "runtime": {"query_max_length": 6, "max_seq_length": 12},
    },
}  # fmt: skip


def model_yaml(directory: Path, profile: dict, dim: int = TOKEN_DIM) -> Any:
    return parse_model_config(
        {
            "sie_id": "acme/colbert",
            "weights_path": str(directory),
            "max_sequence_length": 64,
            "tasks": {"encode": {"multivector": {"dim": dim}}, "score": {}},
            "profiles": {"default": {**profile, "max_batch_tokens": 512}},
        }
    )


def reference_vectors(
    model: Any, projection: np.ndarray, ids: list[int], is_query: bool, expand_to: int, marker: int, limit: int
) -> np.ndarray:
    """One text through transformers alone: marker after [CLS], cut to `limit` keeping [SEP], expansion unattended,
    projection, normalisation; the positions kept as PyLate keeps them (every token of an expanded query; else the
    attended ones, less punctuation for documents)."""
    import torch

    ids = [ids[0], marker, *ids[1:]]
    if len(ids) > limit:
        ids = [*ids[: limit - 1], ids[-1]]
    attention = [1] * len(ids) + [0] * max(0, expand_to - len(ids))
    ids = ids + [VOCAB.index("[MASK]")] * max(0, expand_to - len(ids))
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([attention])).last_hidden_state[0]
    vectors = hidden.numpy() @ projection.T
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    keep = [bool(expand_to) or (attended and (is_query or token not in PUNCTUATION_IDS))
            for token, attended in zip(ids, attention, strict=True)]  # fmt: skip
    return vectors[keep]


def multivectors(loaded: Any, texts: list[str], is_query: bool) -> list[np.ndarray]:
    results = loaded.adapter.encode(encode_items(texts, is_query=is_query)).items
    assert all(result.ok for result in results), [result.error for result in results]
    return [np.asarray(result.result["multivector"]["values"]) for result in results]


LAYOUTS = {
    # layout: (save, profile, query marker, document marker, query expansion length)
    "stanford": (save_stanford, STANFORD_PROFILE, "[unused0]", "[unused1]", 8),
    "pylate": (save_pylate, PYLATE_PROFILE, "[Q] ", "[D] ", 0),
}


# A GPU loader's adapter keeps the token states on the device and projects them there (the device is the seam: its
# sessions run on the CPU provider here, tests/integration/conftest.py); only the projected vectors reach the host.
LOADERS = ["model_loader", "gpu_loader"]


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_queries_and_documents_encode_as_the_checkpoint_was_trained(
    loader: str, request: pytest.FixtureRequest, tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    save, profile, query_marker, doc_marker, expansion = LAYOUTS[layout]
    model, projection = save(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    config = model_yaml(tmp_path, profile)
    loaded = request.getfixturevalue(loader).load(config, "default", config.sie_id)
    assert (loaded.adapter._device is not None) == (loader == "gpu_loader")
    monkeypatch.setattr(DeviceTokenStates, "to_host", lambda states: pytest.fail("token states copied to the host"))
    runtime = profile["adapter_options"]["runtime"]
    for texts, is_query, marker, limit in (
        (QUERIES, True, query_marker, runtime["query_max_length"]),
        (DOCS, False, doc_marker, runtime["max_seq_length"]),
    ):
        ours = multivectors(loaded, texts, is_query)
        for text, vectors in zip(texts, ours, strict=True):
            expected = reference_vectors(
                model, projection, tokenizer.encode(text).ids, is_query, expansion if is_query else 0,
                tokenizer.token_to_id(marker), limit,
            )  # fmt: skip
            assert vectors.shape == expected.shape
            assert float(np.abs(vectors - expected).max()) <= 1e-4
    # the limits and the expansion are what shaped them: an expanded query is exactly its limit long
    if expansion:
        assert {len(vectors) for vectors in multivectors(loaded, QUERIES, True)} == {expansion}


def test_documents_keep_the_profiles_doc_max_length(model_loader, tmp_path: Path) -> None:
    """mxbai-colbert-large-v1's profile cuts documents at `doc_max_length` (256 of its 512 tokens); queries keep
    their own limit; a request's `max_seq_length` still cuts below it."""
    model, projection = save_stanford(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    profile = json.loads(json.dumps(STANFORD_PROFILE))
    profile["adapter_options"]["loadtime"]["doc_max_length"] = 9
    profile["adapter_options"]["runtime"] = {"query_max_length": 8}
    config = model_yaml(tmp_path, profile)
    loaded = model_loader.load(config, "default", config.sie_id)
    marker = tokenizer.token_to_id("[unused1]")
    for text, vectors in zip(DOCS, multivectors(loaded, DOCS, False), strict=True):
        expected = reference_vectors(model, projection, tokenizer.encode(text).ids, False, 0, marker, 9)
        assert vectors.shape == expected.shape
        assert float(np.abs(vectors - expected).max()) <= 1e-4
    assert max(len(tokenizer.encode(text).ids) for text in DOCS) + 1 > 9  # a document was cut
    items = encode_items(DOCS, is_query=False, options={"max_seq_length": 5})
    assert max(item.result["multivector"]["num_tokens"] for item in loaded.adapter.encode(items).items) <= 5
    profile["adapter_options"]["loadtime"]["doc_max_length"] = 0
    with pytest.raises(ModelLoadError, match="doc_max_length must be a whole number"):
        model_loader.load(model_yaml(tmp_path, profile), "default", config.sie_id)


def test_the_muvera_profile_returns_the_public_servers_encoding_of_the_token_vectors(
    model_loader, tmp_path: Path, public_wheel: Path
) -> None:
    """The public ColBERT YAMLs' `muvera` profile (`muvera: {}`, output_types [dense]) over the default's load-time
    `muvera_config`: each item's dense vector is the public server's MuveraPostprocessor applied to the token vectors
    this model returns (themselves checked against transformers above), queries summed and documents averaged;
    both outputs may come together, and without `muvera` a dense output is refused."""
    save_stanford(tmp_path)
    settings = {"num_repetitions": 6, "num_simhash_projections": 3, "projection_dim": 4, "final_projection_dim": None}
    default = json.loads(json.dumps(STANFORD_PROFILE))
    default["adapter_options"]["loadtime"]["muvera_config"] = settings
    raw = {"sie_id": "acme/colbert", "weights_path": str(tmp_path), "max_sequence_length": 64,
           "tasks": {"encode": {"multivector": {"dim": TOKEN_DIM}}, "score": {}},
           "profiles": {"default": {**default, "max_batch_tokens": 512},
                        "muvera": {"extends": "default", "adapter_options": {"runtime": {
                            "muvera": {}, "output_types": ["dense"], "query_max_length": 8}}}}}  # fmt: skip
    config = parse_model_config(raw)
    loaded = model_loader.load(config, "muvera", "acme/colbert:muvera")
    sys.path.append(str(public_wheel))
    try:
        from sie_server.core.inference_output import EncodeOutput  # noqa: PLC0415 - the reference, from the wheel
        from sie_server.core.postprocessor import MuveraConfig, MuveraPostprocessor  # noqa: PLC0415
    finally:
        sys.path.remove(str(public_wheel))
    public = MuveraPostprocessor(token_dim=TOKEN_DIM, config=MuveraConfig(**settings))
    for texts, is_query in ((QUERIES, True), (DOCS, False)):
        items = encode_items(texts, is_query=is_query, output_types=["dense", "multivector"])
        results = loaded.adapter.encode(items).items
        assert all(result.ok for result in results), [result.error for result in results]
        tokens = [np.asarray(result.result["multivector"]["values"]) for result in results]
        reference = EncodeOutput(batch_size=len(tokens), multivector=tokens)
        public.transform(reference, is_query=is_query)
        for result, expected in zip(results, reference.dense, strict=True):
            assert result.result["dense"]["dims"] == public.target_dim == 6 * 8 * 4
            assert float(np.abs(np.asarray(result.result["dense"]["values"]) - expected).max()) <= 1e-5
        only_dense = loaded.adapter.encode(encode_items(texts, is_query=is_query)).items  # the profile's output_types
        assert all(set(result.result) == {"dense"} for result in only_dense)
    refused = loaded.adapter.encode(encode_items(QUERIES[:1], options={"muvera": None}, output_types=["dense"]))
    assert not refused.items[0].ok and "does not support output types: {'dense'}" in refused.items[0].error


@pytest.mark.parametrize("loader", LOADERS)
def test_scores_are_maxsim_over_the_encoded_vectors(
    loader: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model, projection = save_stanford(tmp_path)
    config = model_yaml(tmp_path, STANFORD_PROFILE)
    loaded = request.getfixturevalue(loader).load(config, "default", config.sie_id)
    query = multivectors(loaded, QUERIES[:1], True)[0]
    docs = multivectors(loaded, DOCS, False)
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": QUERIES[0]}, score_items=[{"text": doc} for doc in DOCS])  # fmt: skip
    (result,) = loaded.adapter.score([item]).items
    scores = {row["item_id"]: row["score"] for row in result.result}
    for index, doc in enumerate(docs):
        assert scores[f"item-{index}"] == pytest.approx(float((query @ doc.T).max(axis=1).sum()), abs=1e-4)


def test_a_projection_of_another_width_than_the_yaml_fails_the_load_naming_both(model_loader, tmp_path) -> None:
    save_pylate(tmp_path)
    config = model_yaml(tmp_path, PYLATE_PROFILE, dim=16)
    declared = r"8-dimensional multivector vectors, but the model's YAML declares dim 16"
    with pytest.raises(ModelLoadError, match=declared):
        model_loader.load(config, "default", config.sie_id)


def test_a_colbert_checkpoint_without_its_projection_is_refused(model_loader, tmp_path: Path) -> None:
    save_pylate(tmp_path)
    (tmp_path / "modules.json").unlink()
    config = model_yaml(tmp_path, PYLATE_PROFILE)
    declared = r"32-dimensional multivector vectors, but the model's YAML declares dim 8"
    with pytest.raises(ModelLoadError, match=declared):
        model_loader.load(config, "default", config.sie_id)
