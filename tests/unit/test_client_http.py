"""Both clients against scripted HTTP answers: retry drivers, results and errors (sie.client; contracts Part A §2.5).

The seam under test is HTTP, so httpx.MockTransport serves every answer: a sync handler for SIEClient and an
async handler for SIEAsyncClient. The sleep, clock and jitter are injected, so no test waits.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest

from sie.client import (
    IncompleteBatchError,
    ModelLoadFailedError,
    ModelLoadingError,
    RateLimitError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEAsyncClient,
    SIEClient,
    SIEConnectionError,
    SIETimeoutError,
)

BASE = "http://sie.test:8080"
MODEL = "BAAI/bge-m3"


class NoJitter:
    def uniform(self, a: float, b: float) -> float:
        return b


def packed(body: Any, status: int = 200, **headers: str) -> httpx.Response:
    content = msgpack.packb(body, default=msgpack_numpy.encode, use_bin_type=True)
    return httpx.Response(status, content=content, headers={"content-type": "application/msgpack", **headers})


def failure(status: int, code: str | None, retry_after: str | None = None, **extra: Any) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(
        status, json={"error": {"code": code, "message": f"{code} says no", **extra}}, headers=headers
    )


def encoded(*ids: str) -> httpx.Response:
    items = [{"id": i, "dense": {"dims": 3, "dtype": "float32", "values": np.arange(3, dtype=np.float32)}} for i in ids]
    return packed({"model": MODEL, "items": items, "timing": {"total_ms": 2.5}})


class Harness:
    """One client over a script of answers (responses, or httpx error classes to raise), with a fake clock."""

    def __init__(self, flavour: str, script: list[Any], **client_options: Any) -> None:
        self.flavour = flavour
        self.script: Iterator[Any] = iter(script)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []
        self.now = 0.0
        common = {"clock": lambda: self.now, "rng": NoJitter(), **client_options}
        if flavour == "sync":
            transport = httpx.MockTransport(self._answer)
            self.client: Any = SIEClient(BASE, transport=transport, sleep=self._sleep, **common)
        else:
            transport = httpx.MockTransport(self._answer_async)
            self.client = SIEAsyncClient(BASE, transport=transport, sleep=self._sleep_async, **common)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = next(self.script)
        if isinstance(answer, type) and issubclass(answer, httpx.RequestError):
            raise answer("scripted failure", request=request)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def _answer_async(self, request: httpx.Request) -> httpx.Response:
        return self._answer(request)

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def _sleep_async(self, seconds: float) -> None:
        self._sleep(seconds)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.client, method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def close(self) -> None:
        if self.flavour == "sync":
            self.client.close()
        else:
            await self.client.aclose()


@pytest.fixture(params=["sync", "async"])
async def harness(request):
    made: list[Harness] = []

    def make(script: list[Any], **client_options: Any) -> Harness:
        made.append(Harness(request.param, script, **client_options))
        return made[-1]

    yield make
    for each in made:
        await each.close()


async def test_model_loading_then_success_retries_once_honouring_retry_after(harness):
    h = harness([failure(503, "MODEL_LOADING", "3"), encoded("a")])
    result = await h.call("encode", MODEL, {"id": "a", "text": "hi"})
    assert h.sleeps == [3.0]
    assert len(h.requests) == 2
    assert h.client.last_retry_count == 1
    np.testing.assert_array_equal(result["dense"], [0.0, 1.0, 2.0])


async def test_model_load_failed_raises_after_one_call_and_no_sleep(harness):
    body = {"detail": {"code": "MODEL_LOAD_FAILED", "message": "gated repo", "error_class": "GATED", "attempts": 2}}
    h = harness([httpx.Response(502, json=body)])
    with pytest.raises(ModelLoadFailedError) as caught:
        await h.call("encode", MODEL, {"text": "hi"})
    assert len(h.requests) == 1
    assert h.sleeps == []
    assert (caught.value.error_class, caught.value.attempts, caught.value.permanent) == ("GATED", 2, True)
    assert h.client.last_retry_count == 0


async def test_resource_exhausted_raises_after_max_oom_retries(harness):
    h = harness([failure(503, "RESOURCE_EXHAUSTED")] * 3)
    with pytest.raises(ResourceExhaustedError) as caught:
        await h.call("encode", MODEL, {"text": "hi"}, max_oom_retries=2)
    assert len(h.requests) == 3
    assert h.sleeps == [5.0, 10.0]
    assert caught.value.retries == 2
    assert h.client.last_retry_count == 2


async def test_resource_exhausted_default_backoff_schedule(harness):
    h = harness([failure(503, "RESOURCE_EXHAUSTED")] * 4)
    with pytest.raises(ResourceExhaustedError):
        await h.call("score", MODEL, {"text": "q"}, [{"text": "d"}])
    assert h.sleeps == [5.0, 10.0, 20.0]


async def test_observed_sequence_ends_with_three_retries_and_success(harness):
    # contracts Part A §2.5: MODEL_LOADING → RESOURCE_EXHAUSTED (header code) → QUEUE_FULL → 200.
    oom_by_header = httpx.Response(
        503,
        json={"detail": {"code": "MODEL_LOADING", "message": "m"}},
        headers={"X-SIE-Error-Code": "RESOURCE_EXHAUSTED", "Retry-After": "2"},
    )
    h = harness([failure(503, "MODEL_LOADING", "5"), oom_by_header, failure(503, "QUEUE_FULL", "1"), encoded("a")])
    result = await h.call("encode", MODEL, [{"id": "a", "text": "hi"}])
    assert h.client.last_retry_count == 3
    assert h.sleeps == [5.0, 2.0, 1.0]
    assert [r["id"] for r in result] == ["a"]


async def test_lora_loading_is_retried_ten_times_then_raises(harness):
    from sie.client import LoraLoadingError

    h = harness([failure(503, "LORA_LOADING")] * 11)
    with pytest.raises(LoraLoadingError) as caught:
        await h.call("encode", MODEL, {"text": "hi"}, options={"lora": "ad-1"}, wait_for_capacity=False)
    assert len(h.requests) == 11
    assert h.sleeps == [1.0] * 10
    assert caught.value.lora == "ad-1"


async def test_model_loading_stops_when_the_budget_is_spent(harness):
    h = harness([failure(503, "MODEL_LOADING", "5")] * 4)
    with pytest.raises(ModelLoadingError):
        await h.call("encode", MODEL, {"text": "hi"}, provision_timeout_s=12)
    # 5 + 5 + 2 (capped by the budget), then the last attempt still goes out and reports the loading model.
    assert h.sleeps == [5.0, 5.0, 2.0]
    assert len(h.requests) == 4


async def test_rate_limit_is_retried_then_raised_typed(harness):
    h = harness([failure(429, "RATE_LIMIT", "4")] * 3)
    with pytest.raises(RateLimitError) as caught:
        await h.call("extract", MODEL, {"text": "hi"}, provision_timeout_s=10)
    assert h.sleeps == [4.0, 4.0]
    assert caught.value.retry_after == 4.0


async def test_connect_errors_are_retried_only_when_waiting_for_capacity(harness):
    h = harness([httpx.ConnectError, httpx.ConnectError, encoded("a")])
    await h.call("encode", MODEL, {"id": "a", "text": "hi"})
    assert h.sleeps == [5.0, 5.0]

    h = harness([httpx.ConnectError])
    with pytest.raises(SIEConnectionError) as caught:
        await h.call("encode", MODEL, {"text": "hi"}, wait_for_capacity=False)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert BASE in str(caught.value)


async def test_tls_failures_are_never_retried(harness):
    request = httpx.Request("POST", BASE)
    tls = httpx.ConnectError("certificate verify failed", request=request)
    tls.__cause__ = ssl.SSLError("bad certificate")
    h = harness([tls])
    with pytest.raises(SIEConnectionError):
        await h.call("encode", MODEL, {"text": "hi"})
    assert h.sleeps == []


async def test_a_read_timeout_is_never_retried(harness):
    h = harness([httpx.ReadTimeout])
    with pytest.raises(SIETimeoutError) as caught:
        await h.call("encode", MODEL, {"text": "hi"})
    assert isinstance(caught.value, TimeoutError)
    assert len(h.requests) == 1
    assert "Not retried" in str(caught.value)


async def test_broken_connections_are_retried(harness):
    h = harness([httpx.RemoteProtocolError, httpx.ReadError, encoded("a")])
    await h.call("encode", MODEL, {"id": "a", "text": "hi"})
    assert len(h.requests) == 3


async def test_gateway_timeout_is_retried_only_when_waiting(harness):
    h = harness([failure(504, "GATEWAY_TIMEOUT"), encoded("a")])
    await h.call("encode", MODEL, {"id": "a", "text": "hi"})
    assert h.sleeps == [5.0]

    h = harness([failure(504, "GATEWAY_TIMEOUT")])
    with pytest.raises(ServerError) as caught:
        await h.call("encode", MODEL, {"text": "hi"}, wait_for_capacity=False)
    assert caught.value.status_code == 504


async def test_attempt_timeouts_shrink_with_the_budget(harness):
    h = harness([failure(503, "MODEL_LOADING", "8"), encoded("a")], timeout_s=30)
    await h.call("encode", MODEL, {"id": "a", "text": "hi"}, provision_timeout_s=20)
    first, second = (request.extensions["timeout"] for request in h.requests)
    assert first == {"connect": 20.0, "read": 20.0, "write": 20.0, "pool": 20.0}
    assert second == {"connect": 12.0, "read": 12.0, "write": 12.0, "pool": 12.0}


async def test_a_result_count_that_differs_from_the_inputs_raises(harness):
    h = harness([encoded("a")])
    with pytest.raises(IncompleteBatchError) as caught:
        await h.call("encode", MODEL, [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}])
    assert (caught.value.expected, caught.value.received) == (2, 1)
    assert [r["id"] for r in caught.value.results] == ["a"]


async def test_encode_results_single_and_list(harness):
    sparse = {
        "dims": 30522,
        "dtype": "float32",
        "indices": np.array([7, 9], np.int32),
        "values": np.array([0.5, 0.25], np.float32),
    }
    multivector = {"token_dims": 2, "num_tokens": 3, "dtype": "float32", "values": np.ones((3, 2), np.float32)}
    item = {"id": "a", "sparse": sparse, "multivector": multivector}
    body = {"model": MODEL, "items": [item], "timing": {"total_ms": 1.0}}
    h = harness([packed(body, **{"X-SIE-Model-Revision": "rev-1"}), packed(body)])
    single = await h.call("encode", MODEL, {"id": "a", "text": "x"}, output_types=["sparse", "multivector"])
    assert isinstance(single, dict)
    np.testing.assert_array_equal(single["sparse"]["indices"], [7, 9])
    assert single["multivector"].shape == (3, 2)
    assert single["timing"] == {"total_ms": 1.0}
    assert h.client.last_model_revision == "rev-1"
    listed = await h.call("encode", MODEL, [{"id": "a", "text": "x"}])
    assert isinstance(listed, list) and len(listed) == 1
    assert h.client.last_model_revision is None


async def test_json_responses_become_numpy_too(harness):
    body = {
        "model": MODEL,
        "items": [
            {
                "dense": {"dims": 3, "dtype": "float16", "values": [0.5, -1.0, 2.0]},
                "sparse": {"dims": None, "dtype": "float32", "indices": [3, 5], "values": [0.1, 0.2]},
                "multivector": {"token_dims": 2, "num_tokens": 2, "dtype": "float32", "values": [[1, 2], [3, 4]]},
            }
        ],
    }
    h = harness([httpx.Response(200, json=body)])
    result = await h.call("encode", MODEL, {"text": "x"})
    assert result["dense"].dtype == np.float16
    np.testing.assert_array_equal(result["dense"], [0.5, -1.0, 2.0])
    assert result["sparse"]["indices"].dtype == np.int32
    assert result["multivector"].shape == (2, 2)
    assert "timing" not in result


async def test_score_result(harness):
    body = {
        "model": "BAAI/bge-reranker-v2-m3",
        "query_id": "q",
        "scores": [{"item_id": "item-0", "score": 0.998, "rank": 0}, {"item_id": "w", "score": 0.012, "rank": 1}],
    }
    h = harness([packed(body)])
    result = await h.call(
        "score",
        "BAAI/bge-reranker-v2-m3",
        {"id": "q", "text": "What is ML?"},
        [{"text": "a"}, {"id": "w", "text": "b"}],
    )
    assert result == body


async def test_extract_results_always_carry_the_four_lists(harness):
    entity = {"text": "Tim Cook", "label": "person", "score": 0.96, "start": 0, "end": 8}
    body = {"model": "urchade/gliner_multi-v2.1", "items": [{"id": "item-0", "entities": [entity], "data": {}}]}
    h = harness([packed(body)])
    result = await h.call(
        "extract", "urchade/gliner_multi-v2.1", {"text": "Tim Cook is the CEO of Apple."}, labels=["person"]
    )
    assert result["entities"] == [{**entity, "bbox": None}]
    assert (result["relations"], result["classifications"], result["objects"]) == ([], [], [])
    assert result["id"] == "item-0"
    assert "data" not in result


async def test_each_result_carries_the_requests_id_and_metered_units_as_sie_sdk_does(harness):
    entity = {"text": "Tim Cook", "label": "person", "score": 0.96, "start": 0, "end": 8}
    extracted = {"model": "urchade/gliner_multi-v2.1", "items": [{"entities": [entity]}, {"entities": []}]}
    meters = {"X-SIE-Request-ID": "req-7", "X-SIE-Units-Input-Tokens": "42", "X-SIE-Units-Pairs": "007"}
    scored = {"model": "r", "query_id": "q", "scores": [{"item_id": "item-0", "score": 0.5, "rank": 0}]}
    h = harness([
        packed(extracted, **meters),
        packed({"model": MODEL, "items": [{"dense": {"dims": 1, "dtype": "float32", "values": [1.0]}}]},
               **{"X-SIE-Request-ID": " padded "}),
        packed(scored, **{"X-SIE-Request-ID": "req-8", "X-SIE-Units-Pairs": "-1"}),
    ])  # fmt: skip
    first, second = await h.call("extract", "m", [{"text": "Tim Cook"}, {"text": "no one"}], labels=["person"])
    assert first["request"] == second["request"] == {"id": "req-7", "usage": {"input_tokens": 42}}
    assert first["request"] is not second["request"]  # each result its own copy
    encoded_one = await h.call("encode", MODEL, {"text": "x"})
    assert "request" not in encoded_one  # an id with surrounding spaces is not one
    assert (await h.call("score", "r", {"id": "q", "text": "?"}, [{"text": "a"}]))["request"] == {"id": "req-8"}


async def test_catalogue_reads_are_not_retried(harness):
    models = {"models": [{"name": MODEL, "state": "loaded"}]}
    h = harness([httpx.Response(200, json=models), httpx.Response(200, json=models["models"][0])])
    assert await h.call("list_models") == models["models"]
    assert await h.call("get_model", MODEL) == models["models"][0]

    h = harness([failure(503, "MODEL_LOADING", "1")])
    with pytest.raises(ServerError):
        await h.call("list_models")
    assert h.sleeps == []

    h = harness(
        [httpx.Response(404, json={"detail": {"code": "MODEL_NOT_FOUND", "message": "Model 'acme/missing' not found"}})]
    )
    with pytest.raises(RequestError) as caught:
        await h.call("get_model", "acme/missing")
    assert (caught.value.code, caught.value.status_code) == ("MODEL_NOT_FOUND", 404)


async def test_malformed_success_bodies_are_request_errors(harness):
    h = harness(
        [httpx.Response(200, content=b"\xc1", headers={"content-type": "application/msgpack"}), packed({"items": "x"})]
    )
    with pytest.raises(RequestError, match="Malformed encode MessagePack"):
        await h.call("encode", MODEL, {"text": "x"})
    with pytest.raises(RequestError, match="items"):
        await h.call("encode", MODEL, {"text": "x"})


@pytest.mark.parametrize("junk", ["-5", "nan", "later"])
async def test_a_junk_retry_after_falls_back_to_the_default_delay(harness, junk):
    h = harness([failure(503, "MODEL_LOADING", junk), encoded("a")])
    await h.call("encode", MODEL, {"id": "a", "text": "hi"})
    assert h.sleeps == [5.0]


async def test_concurrent_async_calls_keep_their_own_retry_counts():
    script = {
        "slow": [failure(503, "QUEUE_FULL", "0"), failure(503, "QUEUE_FULL", "0"), encoded("a")],
        "fast": [encoded("a")],
    }

    async def answer(request: httpx.Request) -> httpx.Response:
        return script[request.url.path.rsplit("/", 1)[-1]].pop(0)

    async def no_sleep(seconds: float) -> None:
        await asyncio.sleep(0)

    async with SIEAsyncClient(BASE, transport=httpx.MockTransport(answer), sleep=no_sleep) as client:

        async def encode(model: str) -> int:
            await client.encode(model, {"id": "a"})
            return client.last_retry_count

        assert await asyncio.gather(encode("slow"), encode("fast")) == [2, 0]
