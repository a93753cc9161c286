"""The other servers' dialects on `sie run --role all`, through each dialect's real client where one exists: TEI
(`huggingface_hub.InferenceClient` with the model in its base URL; `/embed_sparse`, `/embed_all` and `/rerank` as TEI
answers them), Cohere (`cohere.ClientV2` with a `base_url`: `rerank`, `embed`), Jina's rerank body, and Ollama
(`ollama.Client`: `embed`, `embeddings`). Each answer equals what `/v1/encode` and `/v1/score` give for the same
model and inputs, and each dialect's errors come in its own envelope with the SIE code in `X-SIE-Error-Code`; the
distributed deployment (gateway, NATS, sidecar, worker) answers the dialects alike. Marked slow: it uses the shared
all-in-one server and cluster."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from launcher import Cluster
from support.dialect_answers import DOCS, MINILM, QUERY, SPLADE, TEXTS, native_dense, native_scores

pytestmark = pytest.mark.slow


def test_tei_through_huggingface_hub_with_the_model_in_the_base_url(all_server: str) -> None:
    from huggingface_hub import InferenceClient

    with InferenceClient(model=f"{all_server}/{MINILM}", timeout=60) as client:
        vector = np.asarray(client.feature_extraction(TEXTS[0]), dtype=np.float32).reshape(-1)
    assert np.allclose(vector, native_dense(all_server, TEXTS[:1])[0], atol=1e-5)
    embedded = httpx.post(f"{all_server}/{MINILM}/embed", json={"inputs": TEXTS, "normalize": True}, timeout=60)
    assert embedded.status_code == 200
    assert np.allclose(np.asarray(embedded.json(), dtype=np.float32), native_dense(all_server, TEXTS), atol=1e-5)


def test_tei_info_describes_the_model_in_the_base_url(all_server: str) -> None:
    info = httpx.get(f"{all_server}/{MINILM}/info", timeout=60).json()
    assert info["model_id"] == MINILM and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] > 0
    assert httpx.get(f"{all_server}/acme/missing/info", timeout=60).status_code == 404


def test_teis_openai_routes_take_the_model_from_the_base_url(all_server: str) -> None:
    import openai

    with openai.OpenAI(base_url=f"{all_server}/{MINILM}/v1", api_key="unused", timeout=60) as client:
        answer = client.embeddings.create(model="tei", input=TEXTS)
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="tei", input=[])
    assert answer.model == MINILM and answer.usage.prompt_tokens > 0
    vectors = np.asarray([row.embedding for row in answer.data], dtype=np.float32)
    assert np.allclose(vectors, native_dense(all_server, TEXTS), atol=1e-5)
    assert refused.value.body["param"] == "input"
    plain = httpx.post(f"{all_server}/{MINILM}/embeddings", json={"model": "tei", "input": TEXTS}, timeout=60)
    assert plain.status_code == 200 and plain.json()["model"] == MINILM
    assert np.allclose([row["embedding"] for row in plain.json()["data"]], vectors, atol=1e-6)
    for path in ("v1/embeddings", "embeddings"):
        missing = httpx.post(f"{all_server}/acme/missing/{path}", json={"model": MINILM, "input": "x"}, timeout=60)
        assert missing.status_code == 404 and set(missing.json()) == {"error"}


def test_tei_rerank_sparse_and_token_vectors(all_server: str) -> None:
    reranked = httpx.post(
        f"{all_server}/{MINILM}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}, timeout=60
    ).json()
    native = native_scores(all_server)
    assert [row["index"] for row in reranked] == sorted(native, key=lambda index: -native[index])
    assert all(row["score"] == pytest.approx(native[row["index"]], abs=1e-6) for row in reranked)
    assert reranked[0]["text"] == DOCS[1]
    sparse = httpx.post(f"{all_server}/{SPLADE}/embed_sparse", json={"inputs": TEXTS[0]}, timeout=60).json()
    native = httpx.post(f"{all_server}/v1/encode/{SPLADE}", json={"items": [{"text": TEXTS[0]}]}, timeout=60).json()
    expected = native["items"][0]["sparse"]
    assert [entry["index"] for entry in sparse[0]] == list(expected["indices"])
    assert np.allclose([entry["value"] for entry in sparse[0]], expected["values"], atol=1e-6)
    # token vectors come from a multi-vector model or variant (MiniLM's `:multivector` profile)
    tokens = httpx.post(f"{all_server}/{MINILM}:multivector/embed_all", json={"inputs": [TEXTS[0]]}, timeout=60)
    assert tokens.status_code == 200, tokens.text
    assert np.asarray(tokens.json()[0]).ndim == 2 and np.asarray(tokens.json()[0]).shape[1] == 384


def test_cohere_client_reranks_and_embeds(all_server: str) -> None:
    import cohere

    with httpx.Client(timeout=60) as http:
        client = cohere.ClientV2(api_key="unused", base_url=all_server, httpx_client=http)
        reranked = client.rerank(model=MINILM, query=QUERY, documents=DOCS, top_n=2)
        embedded = client.embed(model=MINILM, texts=TEXTS, input_type="search_document", embedding_types=["float"])
    native = native_scores(all_server)
    best = sorted(native, key=lambda index: -native[index])[:2]
    assert [result.index for result in reranked.results] == best
    assert [result.relevance_score for result in reranked.results] == pytest.approx([native[i] for i in best], abs=1e-6)
    assert np.allclose(np.asarray(embedded.embeddings.float_, dtype=np.float32), native_dense(all_server, TEXTS),
                       atol=1e-5)  # fmt: skip


def test_jinas_rerank_body_gets_documents_and_usage(all_server: str) -> None:
    answer = httpx.post(
        f"{all_server}/v1/rerank",
        json={"model": MINILM, "query": QUERY, "documents": [{"text": doc} for doc in DOCS], "top_n": 1},
        timeout=60,
    ).json()
    assert answer["results"][0]["index"] == 1 and answer["results"][0]["document"] == {"text": DOCS[1]}
    assert answer["usage"]["total_tokens"] > 0


def test_ollama_client_embeds(all_server: str) -> None:
    import ollama

    with ollama.Client(host=all_server, timeout=60) as client:
        embedded = client.embed(model=MINILM, input=TEXTS)
        legacy = client.embeddings(model=MINILM, prompt=TEXTS[0])
    assert np.allclose(np.asarray(embedded.embeddings, dtype=np.float32), native_dense(all_server, TEXTS), atol=1e-5)
    assert embedded.prompt_eval_count and embedded.prompt_eval_count > 0
    expected = native_dense(all_server, TEXTS[:1])[0]
    assert np.allclose(np.asarray(legacy.embedding, dtype=np.float32), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "envelope"),
    [
        (f"/{MINILM}/embed", {"inputs": 3}, 422, {"error", "error_type"}),
        ("/acme/missing/embed", {"inputs": "x"}, 404, {"error", "error_type"}),
        ("/v2/rerank", {"model": "acme/missing", "query": "q", "documents": ["d"]}, 404, {"message"}),
        ("/v2/embed", {"model": MINILM, "texts": ["x"], "input_type": "poetry"}, 400, {"message"}),
        ("/api/embed", {"model": MINILM}, 400, {"error"}),
        ("/embed_sparse", {"inputs": "x"}, 422, {"error", "error_type"}),  # the root route has no default model
    ],
)
def test_each_dialect_answers_errors_in_its_own_envelope(
    all_server: str, path: str, body: dict, status: int, envelope: set[str]
) -> None:
    answer = httpx.post(f"{all_server}{path}", json=body, timeout=60)
    assert answer.status_code == status, answer.text
    assert set(answer.json()) == envelope
    assert answer.headers.get("x-sie-error-code")


def test_a_post_to_an_unknown_native_path_is_not_taken_for_a_model(all_server: str) -> None:
    assert httpx.post(f"{all_server}/v1/models", json={}, timeout=10).status_code == 405


def test_the_dialects_run_through_the_distributed_path(cluster: Cluster, cluster_grpc: str) -> None:
    """Gateway, NATS, sidecar and worker: Cohere's rerank, Ollama's embed, KServe over gRPC and TEI's tokenize and
    decode answer as the native routes do."""
    import cohere
    import ollama

    with httpx.Client(timeout=60) as http:
        reranked = cohere.ClientV2(api_key="unused", base_url=cluster.url, httpx_client=http).rerank(
            model=MINILM, query=QUERY, documents=DOCS
        )
    native = native_scores(cluster.url)
    assert [result.index for result in reranked.results] == sorted(native, key=lambda index: -native[index])
    with ollama.Client(host=cluster.url, timeout=60) as client:
        embedded = client.embed(model=MINILM, input=TEXTS)
    assert np.allclose(np.asarray(embedded.embeddings, dtype=np.float32), native_dense(cluster.url, TEXTS), atol=1e-5)
    # KServe over gRPC on the gateway role, through NATS to the worker
    import tritonclient.grpc as triton

    with triton.InferenceServerClient(url=cluster_grpc) as client:
        assert client.is_server_ready() and client.is_model_ready(MINILM)
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        vectors = client.infer(MINILM, [text]).as_numpy("dense")
    assert np.allclose(vectors, native_dense(cluster.url, TEXTS), atol=1e-5)
    # TEI's tokenize and decode cross NATS to the sidecar, which answers them with the model's tokenizer
    tokens = httpx.post(f"{cluster.url}/{MINILM}/tokenize", json={"inputs": "Hello world"}, timeout=60)
    assert tokens.status_code == 200, tokens.text
    assert [token["id"] for token in tokens.json()[0]] == HELLO_WORLD_IDS
    decoded = httpx.post(f"{cluster.url}/{MINILM}/decode", json={"ids": HELLO_WORLD_IDS}, timeout=60)
    assert decoded.status_code == 200 and decoded.json() == ["hello world"]


# bert-base-uncased's WordPiece ids, which MiniLM's tokenizer keeps: [CLS] hello world [SEP]
HELLO_WORLD_IDS = [101, 7592, 2088, 102]


def test_tei_predict_scores_pairs_as_the_score_route(all_server: str) -> None:
    pairs = [[QUERY, doc] for doc in DOCS] + [[TEXTS[0], DOCS[2]]]
    answer = httpx.post(f"{all_server}/{MINILM}/predict", json={"inputs": pairs}, timeout=60)
    assert answer.status_code == 200, answer.text
    native = native_scores(all_server)
    rows = answer.json()
    assert all(len(row) == 1 and row[0]["label"] == "LABEL_0" for row in rows)
    assert [row[0]["score"] for row in rows[:3]] == pytest.approx([native[i] for i in range(len(DOCS))], abs=1e-6)
    single = httpx.post(f"{all_server}/{MINILM}/predict", json={"inputs": [QUERY, DOCS[1]]}, timeout=60).json()
    assert single[0][0]["score"] == pytest.approx(native[1], abs=1e-6)
    refused = httpx.post(f"{all_server}/{MINILM}/predict", json={"inputs": "just one text"}, timeout=60)
    assert refused.status_code == 422 and "pair" in refused.json()["error"]


def test_tei_tokenize_and_decode_use_the_models_tokenizer(all_server: str) -> None:
    text = "Hello world, naïve café!"
    answer = httpx.post(f"{all_server}/{MINILM}/tokenize", json={"inputs": [text, "Hello world"]}, timeout=60)
    assert answer.status_code == 200, answer.text
    first, second = answer.json()
    assert [token["id"] for token in second] == HELLO_WORLD_IDS
    assert first[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert all(text[token["start"] : token["stop"]] == token["text"] for token in first if not token["special"])
    assert [token["text"] for token in first[1:-1]] == ["Hello", "world", ",", "naïve", "café", "!"]
    plain = httpx.post(f"{all_server}/{MINILM}/tokenize", json={"inputs": "Hello world", "add_special_tokens": False},
                       timeout=60).json()  # fmt: skip
    assert [token["id"] for token in plain[0]] == HELLO_WORLD_IDS[1:-1]
    long = httpx.post(f"{all_server}/{MINILM}/tokenize", json={"inputs": "word " * 1000}, timeout=60).json()
    assert len(long[0]) == 256  # as the model reads it: cut at its max length

    decoded = httpx.post(f"{all_server}/{MINILM}/decode", json={"ids": [HELLO_WORLD_IDS, [7592]]}, timeout=60)
    assert decoded.status_code == 200 and decoded.json() == ["hello world", "hello"]
    kept = httpx.post(f"{all_server}/{MINILM}/decode", json={"ids": HELLO_WORLD_IDS, "skip_special_tokens": False},
                      timeout=60)  # fmt: skip
    assert kept.json() == ["[CLS] hello world [SEP]"]
    unknown = httpx.post(f"{all_server}/{MINILM}/decode", json={"ids": [7592, 10**9]}, timeout=60)
    assert unknown.status_code == 422 and str(10**9) in unknown.json()["error"]
    assert unknown.headers["x-sie-error-code"] == "INVALID_INPUT"
    assert httpx.post(f"{all_server}/acme/missing/tokenize", json={"inputs": "x"}, timeout=60).status_code == 404
    assert httpx.post(f"{all_server}/{MINILM}/decode", json={"ids": "x"}, timeout=60).status_code == 422


def assert_scores_as_native(triton: Any, client: Any, url: str) -> None:
    """A score through Triton's client (`tritonclient.http` or `.grpc`: the same InferInput API): BYTES `query` and
    `text` in, FP32 `scores` out, equal to `/v1/score`'s in document order."""
    query = triton.InferInput("query", [1], "BYTES")
    query.set_data_from_numpy(np.array([QUERY.encode()], dtype=object))
    docs = triton.InferInput("text", [len(DOCS)], "BYTES")
    docs.set_data_from_numpy(np.array([doc.encode() for doc in DOCS], dtype=object))
    scores = client.infer(MINILM, [query, docs]).as_numpy("scores")
    native = native_scores(url)
    assert np.allclose(scores, [native[index] for index in range(len(DOCS))], atol=1e-6)


def test_tritons_http_client_speaks_the_open_inference_protocol(all_server: str) -> None:
    """KServe V2: health, metadata, and infer with binary tensor data both ways (tritonclient's default) and JSON."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(url=all_server.removeprefix("http://"), network_timeout=60.0)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MINILM)
        metadata = client.get_model_metadata(MINILM)
        assert {"name": "dense", "datatype": "FP32", "shape": [-1, 384]} in metadata["outputs"]
        for binary in (True, False):
            text = triton.InferInput("text", [len(TEXTS)], "BYTES")
            text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object), binary_data=binary)
            result = client.infer(MINILM, [text], outputs=[triton.InferRequestedOutput("dense", binary_data=binary)])
            assert np.allclose(result.as_numpy("dense"), native_dense(all_server, TEXTS), atol=1e-5)
        assert_scores_as_native(triton, client, all_server)
    finally:
        client.close()


def test_tritons_grpc_client_speaks_the_open_inference_protocol(all_server: str, all_server_grpc: str) -> None:
    """KServe V2 over gRPC (SIE_GATEWAY_GRPC_PORT): health, metadata, infer (raw tensor contents, tritonclient's
    default) and score; failures as gRPC statuses with the SIE code in the trailing metadata."""
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    with triton.InferenceServerClient(url=all_server_grpc) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MINILM)
        assert client.get_server_metadata().name == "sie"
        metadata = client.get_model_metadata(MINILM)
        dense = next(output for output in metadata.outputs if output.name == "dense")
        assert dense.datatype == "FP32" and list(dense.shape) == [-1, 384]
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        result = client.infer(MINILM, [text], outputs=[triton.InferRequestedOutput("dense")], request_id="r-1")
        assert result.get_response().id == "r-1" and result.get_response().model_name == MINILM
        assert np.allclose(result.as_numpy("dense"), native_dense(all_server, TEXTS), atol=1e-5)
        assert_scores_as_native(triton, client, all_server)
        queried = client.infer(MINILM, [text], parameters={"is_query": True}).as_numpy("dense")
        assert np.allclose(queried, native_dense(all_server, TEXTS, options={"is_query": True}), atol=1e-5)

        with pytest.raises(InferenceServerException) as missing:
            client.get_model_metadata("acme/missing")
        assert missing.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as ragged:
            client.infer(MINILM, [text], outputs=[triton.InferRequestedOutput("sparse")])
        assert ragged.value.status() == "StatusCode.INVALID_ARGUMENT" and "ragged" in ragged.value.message()
        with pytest.raises(InferenceServerException) as unserved:
            client.get_model_config(MINILM)
        assert unserved.value.status() == "StatusCode.UNIMPLEMENTED"
    # counted with the HTTP requests, by the call's path and the HTTP status of its outcome
    metrics = httpx.get(f"{all_server}/metrics", timeout=60).text
    assert f'model="{MINILM}",route="/inference.GRPCInferenceService/ModelInfer",status="200"' in metrics
    assert 'model="other",route="/inference.GRPCInferenceService/ModelMetadata",status="404"' in metrics


def test_the_open_inference_protocol_refuses_in_its_envelope(all_server: str) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
            "outputs": [{"name": "sparse"}]}  # fmt: skip
    answer = httpx.post(f"{all_server}/v2/models/{MINILM}/infer", json=body, timeout=60)
    assert answer.status_code == 400 and set(answer.json()) == {"error"} and "ragged" in answer.json()["error"]
    missing = httpx.get(f"{all_server}/v2/models/acme/missing", timeout=60)
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
    assert httpx.get(f"{all_server}/v2/models/{MINILM}/versions/2", timeout=60).status_code == 404
