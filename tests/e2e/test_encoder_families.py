"""Converted encoder families served end to end: `sie run --role all` over a catalogue of tiny random checkpoints
in local `weights_path` directories (BERT, XLM-RoBERTa through the public `xlm_roberta_flash` module, MPNet,
ModernBERT through `modernbert_flash`, an XLM-R cross-encoder scored like bge-reranker-v2-m3, a BGE-M3 through
`bge_m3_flash` with its three outputs, and two remote-code layouts through their public modules: jina-reranker-v2's
flash XLM-R and nomic-embed-text-v2-moe's experts), asked through the public sie-sdk and the OpenAI client. Every
vector and score equals what transformers (for the experts: the numpy reference of their modeling code) computes on
the same tokens (≤ 1e-4), a text longer than the model's positions included (cut to them, not failed). The catalogue
also holds files the server cannot serve — one that does not parse, one naming an adapter module no bundle runs
(florence2) — which are listed as not servable while the rest is served. Marked slow: it starts a server process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from integration.test_jina_flash import save_flash_reranker
from integration.test_remote_code_families import write_tokenizer as write_word_tokenizer
from launcher import REPO, serving_all
from sie.catalog import dump_yaml
from support.encoder_checkpoints import (
    BGE_M3_COLBERT_DIM,
    POSITIONS,
    ROBERTA_STYLE,
    VOCAB,
    WORDS,
    bge_m3_reference,
    save_bge_m3,
    save_checkpoint,
)
from unit import test_convert_nomic as nomic

pytestmark = pytest.mark.slow

# The unit tests check every family's graph; here, one of each serving path: BERT through our module, XLM-R and
# ModernBERT through the public modules, MPNet (its own positions), and a cross-encoder below.
FAMILIES = ("bert", "xlm-roberta", "mpnet", "modernbert")
RERANKER = "tiny/xlm-roberta-reranker"
BGE_M3 = "tiny/bge-m3"
TEXTS = ["w1 w2 w3", "w40", " ".join(WORDS[:60])]  # the last is longer than the models' 40 positions
TOLERANCE = 1e-4
# Families served through the public catalogue's module names, as its YAMLs name them.
PUBLIC_MODULES = {
    "xlm-roberta": "sie_server.adapters.xlm_roberta_flash:XLMRobertaFlashAdapter",
    "modernbert": "sie_server.adapters.modernbert_flash:ModernBERTFlashAdapter",
}
# The remote-code layouts, through the public modules their YAMLs name: jina-reranker-v2's flash XLM-R and
# nomic-embed-text-v2-moe's experts (their checkpoint writers and references are the converter tests').
JINA_RERANKER, JINA_RERANKER_MODULE = "tiny/jina-reranker-v2", "sie_server.adapters.jina_flash_cross_encoder:X"
NOMIC_MOE, NOMIC_MOE_MODULE = "tiny/nomic-v2-moe", "sie_server.adapters.nomic_flash:NomicFlashAdapter"
BROKEN_FILE = "acme__broken.yaml"
UNROUTED = "acme/florence-only"
UNROUTED_YAML = """\
sie_id: acme/florence-only
hf_id: acme/florence-only
tasks: {extract: {}}
profiles:
  default: {adapter_path: 'sie_server.adapters.florence2:Florence2Adapter', max_batch_tokens: 1024}
"""


def model_id(family: str) -> str:
    return f"tiny/{family}"


def write_yaml(models_dir: Path, sie_id: str, weights: Path, adapter_path: str, tasks: dict) -> None:
    data = {
        "sie_id": sie_id,
        "weights_path": str(weights),
        "max_sequence_length": 128,  # more than the checkpoints' positions: the loader cuts it to them
        "tasks": tasks,
        "profiles": {
            "default": {
                "adapter_path": adapter_path,
                "max_batch_tokens": 1024,
                "adapter_options": {"runtime": {"pooling": "mean", "normalize": True}},
            }
        },
    }
    (models_dir / f"{sie_id.replace('/', '__')}.yaml").write_text(dump_yaml(data))


class Served:
    def __init__(self, url: str, root: Path, models: dict[str, Any]) -> None:
        self.url, self.root, self.models = url, root, models

    def tokenizer(self, sie_id: str) -> Tokenizer:
        directory = self.root / "weights" / sie_id.replace("/", "__")
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        family = {BGE_M3: "xlm-roberta"}.get(sie_id) or sie_id.removeprefix("tiny/").removesuffix("-reranker")
        # The positions a sequence can use: RoBERTa's start after its padding id.
        tokenizer.enable_truncation(POSITIONS - 2 if family in ROBERTA_STYLE else POSITIONS)
        return tokenizer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("families")
    models_dir = root / "models"
    models_dir.mkdir()
    models = {}
    for family in FAMILIES:
        weights = root / "weights" / model_id(family).replace("/", "__")
        models[model_id(family)] = save_checkpoint(weights, family, "none")
        adapter = PUBLIC_MODULES.get(family, "sie.adapters.dense:OnnxDenseAdapter")
        write_yaml(models_dir, model_id(family), weights, adapter, {"encode": {"dense": {"dim": 32}}})
    weights = root / "weights" / RERANKER.replace("/", "__")
    models[RERANKER] = save_checkpoint(weights, "xlm-roberta", "seq-cls", num_labels=1)
    write_yaml(models_dir, RERANKER, weights, "sie.adapters.cross_encoder:OnnxCrossEncoderAdapter", {"score": {}})
    weights = root / "weights" / BGE_M3.replace("/", "__")
    models[BGE_M3] = save_bge_m3(weights)
    tasks = {"encode": {"dense": {"dim": 32}, "sparse": {"dim": VOCAB}, "multivector": {"dim": BGE_M3_COLBERT_DIM}}}
    write_yaml(models_dir, BGE_M3, weights, "sie_server.adapters.bge_m3_flash:BGEM3FlashAdapter", tasks)
    weights = root / "weights" / JINA_RERANKER.replace("/", "__")
    models[JINA_RERANKER] = save_flash_reranker(weights)
    write_yaml(models_dir, JINA_RERANKER, weights, JINA_RERANKER_MODULE, {"score": {}})
    weights = root / "weights" / NOMIC_MOE.replace("/", "__")
    config = nomic.moe_config()
    models[NOMIC_MOE] = (config, nomic.save_checkpoint(weights, config))
    write_word_tokenizer(weights, nomic.VOCAB)
    write_yaml(models_dir, NOMIC_MOE, weights, NOMIC_MOE_MODULE, {"encode": {"dense": {"dim": nomic.HIDDEN}}})
    (models_dir / BROKEN_FILE).write_text("sie_id: acme/broken\nprofiles: [unclosed\n")
    (models_dir / "acme__florence-only.yaml").write_text(UNROUTED_YAML)
    env = {"SIE_MODELS_DIR": str(models_dir), "SIE_MODEL_CACHE": str(root / "cache")}
    with serving_all(root / "server.log", ["--bundles-dir", str(REPO / "config" / "bundles")], env) as url:
        yield Served(url, root, models)


def reference_vectors(served: Served, sie_id: str, texts: list[str]) -> np.ndarray:
    import torch

    tokenizer, model = served.tokenizer(sie_id), served.models[sie_id]
    vectors = []
    for text in texts:
        ids = torch.tensor([tokenizer.encode(text).ids])
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
        vectors.append(torch.nn.functional.normalize(hidden.mean(0), dim=-1).numpy())
    return np.stack(vectors)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_public_sdk_gets_what_transformers_computes(served: Served, public_sdk, family: str) -> None:
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        results = client.encode(model_id(family), [{"text": text} for text in TEXTS], wait_for_capacity=True)
    finally:
        client.close()
    ours = np.stack([np.asarray(result["dense"], dtype=np.float32) for result in results])
    expected = reference_vectors(served, model_id(family), TEXTS)
    assert ours.shape == expected.shape == (len(TEXTS), 32)
    assert float(np.abs(ours - expected).max()) <= TOLERANCE


def test_the_openai_client_gets_the_same_vectors(served: Served) -> None:
    import openai

    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=120, max_retries=3) as client:
        response = client.embeddings.create(model=model_id("xlm-roberta"), input=TEXTS)
        ours = np.asarray([item.embedding for item in response.data], dtype=np.float32)
        assert float(np.abs(ours - reference_vectors(served, model_id("xlm-roberta"), TEXTS)).max()) <= TOLERANCE


def assert_scores_as_transformers(served: Served, public_sdk: Any, sie_id: str, tokenizer: Tokenizer) -> None:
    """A query's scores through the public SDK equal the sigmoid of the one-label transformers model's logit for each
    (query, document) pair (one label: sigmoid, as sentence-transformers does)."""
    import torch

    query, docs = "w1 w2", ["w1 w2 w3", "w7 w8", "w30 w31 w32 w33"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        scored = client.score(sie_id, {"text": query}, [{"text": doc} for doc in docs], wait_for_capacity=True)
    finally:
        client.close()
    expected = {}
    for index, doc in enumerate(docs):
        ids = torch.tensor([tokenizer.encode(query, doc).ids])
        with torch.no_grad():
            logit = served.models[sie_id](input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, 0]
        expected[f"item-{index}"] = float(torch.sigmoid(logit))
    ours = {row["item_id"]: row["score"] for row in scored["scores"]}
    assert ours.keys() == expected.keys()
    assert max(abs(ours[key] - expected[key]) for key in ours) <= TOLERANCE


def test_an_xlm_roberta_cross_encoder_scores_as_transformers_does(served: Served, public_sdk) -> None:
    assert_scores_as_transformers(served, public_sdk, RERANKER, served.tokenizer(RERANKER))


def test_bge_m3_gives_its_three_outputs_through_the_public_sdk(served: Served, public_sdk) -> None:
    """Dense (the profile here pools by mean: the YAML's options are honoured), sparse and multi-vector in one call."""
    import torch

    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        results = client.encode(BGE_M3, [{"text": text} for text in TEXTS[:2]],
                                output_types=["dense", "sparse", "multivector"], wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    tokenizer, (model, sparse, colbert) = served.tokenizer(BGE_M3), served.models[BGE_M3]
    for text, result in zip(TEXTS[:2], results, strict=True):
        ids = tokenizer.encode(text).ids
        expected = bge_m3_reference(model, sparse, colbert, ids)
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[0].mean(0), dim=-1).numpy()
        assert float(np.abs(np.asarray(result["dense"], dtype=np.float32) - dense).max()) <= TOLERANCE
        indices = [int(index) for index in result["sparse"]["indices"]]
        assert indices == sorted(expected["sparse"])
        assert np.allclose(result["sparse"]["values"], [expected["sparse"][i] for i in indices], atol=TOLERANCE)
        vectors = np.asarray(result["multivector"], dtype=np.float32)
        assert vectors.shape == expected["multivector"].shape
        assert float(np.abs(vectors - expected["multivector"]).max()) <= TOLERANCE


def test_jina_reranker_v2s_layout_scores_as_transformers_xlm_roberta_does(served: Served, public_sdk) -> None:
    """The flash XLM-R checkpoint scores as transformers' XLM-R cross-encoder on the weights before Jina's renaming."""
    directory = served.root / "weights" / JINA_RERANKER.replace("/", "__")
    assert_scores_as_transformers(
        served, public_sdk, JINA_RERANKER, Tokenizer.from_file(str(directory / "tokenizer.json"))
    )


def test_nomic_v2_moes_experts_give_their_reference_vectors_through_the_openai_client(served: Served) -> None:
    import openai

    config, weights = served.models[NOMIC_MOE]
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11"]
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=120, max_retries=3) as client:
        ours = np.asarray([item.embedding for item in client.embeddings.create(model=NOMIC_MOE, input=texts).data])
        tokenizer = Tokenizer.from_file(str(served.root / "weights" / NOMIC_MOE.replace("/", "__") / "tokenizer.json"))
        for text, vector in zip(texts, ours, strict=True):
            ids = np.asarray(tokenizer.encode(text).ids, dtype=np.int64)
            pooled = nomic.reference(config, weights, ids, np.zeros_like(ids)).mean(0)
            assert float(np.abs(vector - pooled / np.linalg.norm(pooled)).max()) <= TOLERANCE


def test_files_it_cannot_serve_are_listed_with_their_reason_and_the_rest_is_served(served: Served) -> None:
    body = httpx.get(f"{served.url}/v1/models", timeout=10).json()
    names = {model["name"] for model in body["models"]}
    assert {model_id(family) for family in FAMILIES} <= names
    unservable = {Path(row["source"]).name: row for row in body["unservable"]}
    assert unservable.keys() == {BROKEN_FILE, "acme__florence-only.yaml"}, body["unservable"]
    assert "acme__broken.yaml" in unservable[BROKEN_FILE]["reason"]
    unrouted = unservable["acme__florence-only.yaml"]
    assert unrouted["model_id"] == UNROUTED
    assert "Adapter(s) not in any known bundle: sie_server.adapters.florence2" in unrouted["reason"]
    log = (served.root / "server.log").read_text()
    refused = [line for line in log.splitlines() if "model config left out (not servable)" in line]
    assert len(refused) == 2, refused  # one line per file
    answer = httpx.post(f"{served.url}/v1/extract/{UNROUTED}", json={"items": [{"text": "w1"}]}, timeout=30)
    assert 400 <= answer.status_code < 500, answer.text
