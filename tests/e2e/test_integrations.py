"""The framework integrations that call other servers' dialects, run unchanged against `sie run --role all`: LangChain's
`CohereRerank` over Cohere (its `OpenAIEmbeddings` is test_all_role.py's; `HuggingFaceEndpointEmbeddings` 1.x refuses
a URL and reaches the Hugging Face Hub only), LlamaIndex (the TEI embedding and the TEI
rerank postprocessor) and Haystack (the TEI text, document and sparse embedders and the TEI ranker). Each gives the
vectors and scores `/v1/encode` and `/v1/score` give for the same model and inputs. Haystack's ranker joins `/rerank`
to the host (dropping a base URL's path), so the server names its model with SIE_COMPAT_DEFAULT_MODELS; a root route
without one answers TEI's 422 naming the `/{model}/…` form. Marked slow: it uses the shared all-in-one server."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest

from support.dialect_answers import DOCS, MINILM, QUERY, SPLADE, TEXTS, native_dense, native_scores

pytestmark = pytest.mark.slow

# Haystack reports usage to PostHog unless told not to: the suite talks to loopback only.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")


def best_first(scores: dict[int, float]) -> list[int]:
    return sorted(scores, key=lambda index: -scores[index])


def test_langchains_cohere_rerank_with_a_base_url(all_server: str) -> None:
    import cohere
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    # CohereRerank(base_url=…) builds this same client but never closes its connections; the test closes its own
    with httpx.Client(timeout=60) as http:
        client = cohere.ClientV2(api_key="unused", base_url=all_server, httpx_client=http)
        reranker = CohereRerank(model=MINILM, client=client, top_n=2)
        ranked = reranker.compress_documents([Document(page_content=doc) for doc in DOCS], QUERY)
    native = native_scores(all_server)
    assert [doc.page_content for doc in ranked] == [DOCS[index] for index in best_first(native)[:2]]
    assert [doc.metadata["relevance_score"] for doc in ranked] == pytest.approx(
        [native[index] for index in best_first(native)[:2]], abs=1e-6
    )


def test_llamaindexs_tei_embedding_and_rerank(all_server: str) -> None:
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
    from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

    embedder = TextEmbeddingsInference(model_name=MINILM, base_url=f"{all_server}/{MINILM}", timeout=60)
    vectors = np.asarray(embedder.get_text_embedding_batch(TEXTS), dtype=np.float32)
    assert np.allclose(vectors, native_dense(all_server, TEXTS), atol=1e-5)
    assert np.allclose(embedder.get_query_embedding(TEXTS[1]), vectors[1], atol=1e-5)

    reranker = TextEmbeddingInference(base_url=f"{all_server}/{MINILM}", top_n=2, timeout=60)
    nodes = [NodeWithScore(node=TextNode(text=doc), score=0.0) for doc in DOCS]
    ranked = reranker.postprocess_nodes(nodes, QueryBundle(QUERY))
    native = native_scores(all_server)
    assert [node.node.get_content() for node in ranked] == [DOCS[index] for index in best_first(native)[:2]]
    assert [node.score for node in ranked] == pytest.approx([native[i] for i in best_first(native)[:2]], abs=1e-6)


def test_haystacks_tei_embedders(all_server: str) -> None:
    from haystack import Document
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
        HuggingFaceTEISparseTextEmbedder,
    )

    params = {"url": f"{all_server}/{MINILM}"}
    text = HuggingFaceAPITextEmbedder(api_type="text_embeddings_inference", api_params=params, token=None)
    documents = HuggingFaceAPIDocumentEmbedder(api_type="text_embeddings_inference", api_params=params, token=None)
    embedded = documents.run([Document(content=doc) for doc in TEXTS])["documents"]
    expected = native_dense(all_server, TEXTS, options={"normalize": False})  # Haystack sends normalize false
    assert np.allclose([doc.embedding for doc in embedded], expected, atol=1e-5)
    assert np.allclose(text.run(TEXTS[0])["embedding"], expected[0], atol=1e-5)

    sparse = HuggingFaceTEISparseTextEmbedder(api_base_url=f"{all_server}/{SPLADE}", token=None)
    vector = sparse.run(TEXTS[0])["sparse_embedding"]
    native = httpx.post(f"{all_server}/v1/encode/{SPLADE}", json={"items": [{"text": TEXTS[0]}]}, timeout=60).json()
    expected_sparse = native["items"][0]["sparse"]
    assert list(vector.indices) == list(expected_sparse["indices"])
    assert np.allclose(vector.values, expected_sparse["values"], atol=1e-6)


def test_haystacks_tei_ranker_reaches_the_default_rerank_model(all_server: str) -> None:
    from haystack import Document
    from haystack_integrations.components.rankers.huggingface_api import HuggingFaceTEIRanker

    # the shared server has SIE_COMPAT_DEFAULT_MODELS embed= and rerank= MiniLM (conftest.py), no embed_sparse
    ranker = HuggingFaceTEIRanker(url=f"{all_server}/{MINILM}", top_k=2, token=None)  # it posts to {host}/rerank
    ranked = ranker.run(query=QUERY, documents=[Document(content=doc) for doc in DOCS])["documents"]
    native = native_scores(all_server)
    assert [doc.content for doc in ranked] == [DOCS[index] for index in best_first(native)[:2]]
    assert [doc.score for doc in ranked] == pytest.approx([native[i] for i in best_first(native)[:2]], abs=1e-6)

    embedded = httpx.post(f"{all_server}/embed", json={"inputs": TEXTS}, timeout=60)
    assert embedded.status_code == 200, embedded.text
    assert np.allclose(embedded.json(), native_dense(all_server, TEXTS), atol=1e-5)
    missing = httpx.post(f"{all_server}/embed_sparse", json={"inputs": TEXTS}, timeout=60)
    assert missing.status_code == 422 and missing.headers["x-sie-error-code"] == "INVALID_INPUT"
    assert "/{model}/embed_sparse" in missing.json()["error"]
    assert "SIE_COMPAT_DEFAULT_MODELS=embed_sparse=" in missing.json()["error"]
    # a Jina body at the same path still names its own model
    jina = httpx.post(f"{all_server}/rerank", json={"model": MINILM, "query": QUERY, "documents": DOCS}, timeout=60)
    assert jina.status_code == 200 and jina.json()["results"][0]["index"] == best_first(native)[0]
