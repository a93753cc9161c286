"""Both clients' `generate` and `stream_generate` against scripted HTTP answers (sie.client; sie-sdk 0.10.1's wire).

The seam under test is HTTP: httpx.MockTransport serves each answer, buffered JSON or an event stream, and the
sleep, clock and jitter are injected, so no test waits. Generation is not idempotent, so these tests pin down
which answers are retried (those that come before any work started) and which never are.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sie.client import (
    ModelLoadFailedError,
    ProvisioningError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEAsyncClient,
    SIEClient,
    SIEConnectionError,
    SIETimeoutError,
)

BASE = "http://sie.test:8080"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PATH = "/v1/generate/HuggingFaceTB__SmolLM2-135M-Instruct"
ANSWER = {
    "model": MODEL,
    "text": "Paris.",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    "attempt_id": "req-1",
    "ttft_ms": 20,
    "tpot_ms": 4.5,
}


class NoJitter:
    def uniform(self, a: float, b: float) -> float:
        return b


def failure(status: int, code: str | None, retry_after: str | None = None, **extra: Any) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(
        status, json={"error": {"code": code, "message": f"{code} says no", **extra}}, headers=headers
    )


def openai_error(status: int, message: str, code: str | None, param: str | None) -> httpx.Response:
    """The gateway's generation routes answer errors in OpenAI's envelope."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return httpx.Response(status, json={"error": error})


def chunk(seq: int, text: str, **extra: Any) -> dict[str, Any]:
    return {"request_id": "req-1", "seq": seq, "text_delta": text, "done": False, **extra}


def last(seq: int) -> dict[str, Any]:
    usage = {"prompt_tokens": 12, "completion_tokens": seq + 1, "total_tokens": 13 + seq}
    return chunk(seq, "", done=True, finish_reason="stop", usage=usage, ttft_ms=20.0)


def events(*items: dict[str, Any] | str) -> bytes:
    """An event stream: a map is one `data: {json}` event, a string goes out as it is (comments, [DONE], junk)."""
    lines = [item if isinstance(item, str) else f"data: {json.dumps(item)}\n\n" for item in items]
    return "".join(lines).encode()


def streamed(*items: dict[str, Any] | str) -> httpx.Response:
    return httpx.Response(200, content=events(*items), headers={"content-type": "text/event-stream"})


class CutStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body whose connection breaks after `content`, as when the peer resets mid-stream."""

    def __init__(self, content: bytes) -> None:
        self._content = content

    def __iter__(self) -> Iterator[bytes]:
        yield self._content
        raise httpx.ReadError("connection reset by peer")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._content
        raise httpx.ReadError("connection reset by peer")


class Harness:
    """One client over a script of answers (responses, or httpx error classes to raise), with a fake clock."""

    def __init__(self, flavour: str, script: list[Any], **client_options: Any) -> None:
        self.flavour = flavour
        self.script = iter(script)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []
        self.now = 0.0
        common = {"clock": lambda: self.now, "rng": NoJitter(), **client_options}
        transport = httpx.MockTransport(self._answer)
        if flavour == "sync":
            self.client: Any = SIEClient(BASE, transport=transport, sleep=self._sleep, **common)
        else:
            self.client = SIEAsyncClient(BASE, transport=transport, sleep=self._sleep_async, **common)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = next(self.script)
        if isinstance(answer, type) and issubclass(answer, httpx.RequestError):
            raise answer("scripted failure", request=request)
        return answer

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def _sleep_async(self, seconds: float) -> None:
        self._sleep(seconds)

    def body(self, index: int = -1) -> dict[str, Any]:
        return json.loads(self.requests[index].content)

    async def generate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        result = self.client.generate(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def stream(self, into: list[dict[str, Any]], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """Drain stream_generate into `into`, so a test still sees the chunks that came before an error."""
        chunks = self.client.stream_generate(*args, **kwargs)
        if self.flavour == "sync":
            into.extend(chunks)
        else:
            async for each in chunks:
                into.append(each)
        return into

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


async def test_generate_posts_json_to_the_path_safe_model_and_reads_the_result(harness):
    h = harness([httpx.Response(200, json=ANSWER, headers={"X-SIE-Model-Revision": "abc123"})], options={"a": 1})
    result = await h.generate(MODEL, "Q:", max_new_tokens=8, temperature=0.0, stop=["\n"], seed=7, options={"b": 2})
    assert result == {**ANSWER, "ttft_ms": 20.0}
    request = h.requests[0]
    assert request.method == "POST" and request.url.path == PATH
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json"
    assert h.body() == {
        "prompt": "Q:",
        "max_new_tokens": 8,
        "stop": ["\n"],
        "temperature": 0.0,
        "seed": 7,
        "options": {"a": 1, "b": 2},
    }
    assert h.client.last_model_revision == "abc123"


async def test_unset_sampling_fields_stay_out_of_the_body_and_gpu_routes(harness):
    h = harness([httpx.Response(200, json=ANSWER)])
    await h.generate(MODEL, "Q:", max_new_tokens=8, gpu="mypool/l4")
    assert h.body() == {"prompt": "Q:", "max_new_tokens": 8}
    assert h.requests[0].headers["X-SIE-MACHINE-PROFILE"] == "l4"
    assert h.requests[0].headers["X-SIE-Pool"] == "mypool"


async def test_pre_execution_signals_are_retried(harness):
    script = [
        failure(503, "MODEL_LOADING", "3"),
        failure(503, "PROVISIONING", "2"),
        failure(429, "RATE_LIMIT", "1"),
        failure(503, "QUEUE_FULL", "1"),
        failure(503, "RESOURCE_EXHAUSTED", "4"),
        httpx.ConnectError,
        httpx.Response(200, json=ANSWER),
    ]
    h = harness(script)
    result = await h.generate(MODEL, "Q:", max_new_tokens=8)
    assert result["text"] == "Paris."
    assert h.sleeps == [3.0, 2.0, 1.0, 1.0, 4.0, 5.0]
    assert h.client.last_retry_count == 6


async def test_provisioning_without_waiting_raises_at_once(harness):
    h = harness([failure(503, "PROVISIONING", "2")])
    with pytest.raises(ProvisioningError):
        await h.generate(MODEL, "Q:", max_new_tokens=8, wait_for_capacity=False)
    assert h.sleeps == []


async def test_resource_exhausted_raises_after_max_oom_retries(harness):
    h = harness([failure(503, "RESOURCE_EXHAUSTED")] * 2)
    with pytest.raises(ResourceExhaustedError) as caught:
        await h.generate(MODEL, "Q:", max_new_tokens=8, max_oom_retries=1)
    assert caught.value.retries == 1 and len(h.requests) == 2


async def test_a_gateway_timeout_is_never_retried(harness):
    # The work was published: a worker may be generating, and a second request would run it twice.
    h = harness([failure(504, "GATEWAY_TIMEOUT", "1")])
    with pytest.raises(ServerError) as caught:
        await h.generate(MODEL, "Q:", max_new_tokens=8)
    assert caught.value.status_code == 504
    assert len(h.requests) == 1 and h.sleeps == []


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (httpx.ReadError, SIEConnectionError),
        (httpx.RemoteProtocolError, SIEConnectionError),
        (httpx.WriteTimeout, SIETimeoutError),
        (httpx.ReadTimeout, SIETimeoutError),
    ],  # fmt: skip
)
async def test_a_connection_lost_mid_request_is_never_retried(harness, error, raised):
    h = harness([error])
    with pytest.raises(raised) as caught:
        await h.generate(MODEL, "Q:", max_new_tokens=8)
    assert isinstance(caught.value.__cause__, error)
    assert len(h.requests) == 1 and h.sleeps == []


async def test_the_encode_path_still_retries_a_broken_connection(harness):
    # Generation's rule is its own: the idempotent calls keep retrying a reset connection.
    dense = {"dims": 1, "dtype": "float32", "values": [0.5]}
    encoded = httpx.Response(200, json={"model": "m", "items": [{"dense": dense}]})
    h = harness([httpx.ReadError, encoded])
    result = h.client.encode("m", {"text": "hi"})
    result = await result if inspect.isawaitable(result) else result
    assert len(h.requests) == 2 and result["dense"].tolist() == [0.5]


async def test_unknown_models_and_bad_fields_raise_request_errors_with_the_servers_message(harness):
    h = harness([
        openai_error(404, "Model 'acme/none' not found", "model_not_found", "model"),
        openai_error(400, "Field 'max_new_tokens' must be at least 1", "invalid_request_error", "max_new_tokens"),
    ])  # fmt: skip
    with pytest.raises(RequestError) as missing:
        await h.generate("acme/none", "Q:", max_new_tokens=8)
    assert (missing.value.status_code, missing.value.code, missing.value.param) == (404, "model_not_found", "model")
    assert str(missing.value) == "Model 'acme/none' not found"
    with pytest.raises(RequestError) as refused:
        await h.generate(MODEL, "Q:", max_new_tokens=0)
    assert refused.value.status_code == 400 and refused.value.param == "max_new_tokens"
    assert "must be at least 1" in refused.value.message
    assert len(h.requests) == 2 and h.sleeps == []


async def test_a_model_that_failed_to_load_is_not_retried(harness):
    h = harness([failure(502, "MODEL_LOAD_FAILED", error_class="OSError")])
    with pytest.raises(ModelLoadFailedError):
        await h.generate(MODEL, "Q:", max_new_tokens=8)
    assert len(h.requests) == 1


async def test_a_result_without_text_is_a_request_error(harness):
    h = harness([httpx.Response(200, json={"model": MODEL, "finish_reason": "stop"})])
    with pytest.raises(RequestError, match="'text'"):
        await h.generate(MODEL, "Q:", max_new_tokens=8)


async def test_junk_optional_fields_are_left_out_or_zeroed(harness):
    junk = {"model": MODEL, "text": "x", "finish_reason": 3, "ttft_ms": "soon", "usage": {"prompt_tokens": "n/a"}}
    h = harness([httpx.Response(200, json=junk)])
    result = await h.generate(MODEL, "Q:", max_new_tokens=8)
    assert result == {"model": MODEL, "text": "x", "usage": {"prompt_tokens": 0, "completion_tokens": 0,
                                                             "total_tokens": 0}}  # fmt: skip


async def test_read_timeout_s_is_used_as_given(harness):
    h = harness([httpx.Response(200, json=ANSWER), httpx.Response(200, json=ANSWER)], timeout_s=30)
    await h.generate(MODEL, "Q:", max_new_tokens=8, read_timeout_s=600, provision_timeout_s=20)
    await h.generate(MODEL, "Q:", max_new_tokens=8, provision_timeout_s=20)
    given, default = (request.extensions["timeout"] for request in h.requests)
    assert given["read"] == 600 and given["connect"] == 20
    assert default["read"] == 20


async def test_stream_generate_yields_each_chunk_until_done(harness):
    body = events(": keep-alive\n\n", chunk(0, "Par"), "data:" + json.dumps(chunk(1, "is")) + "\n\n", last(2),
                  "data: [DONE]\n\n", chunk(9, "after the end"))  # fmt: skip
    h = harness([httpx.Response(200, content=body, headers={"X-SIE-Model-Revision": "r1"})])
    chunks = await h.stream([], MODEL, "Q:", max_new_tokens=8, temperature=0.0)
    assert [each["seq"] for each in chunks] == [0, 1, 2]
    assert "".join(each["text_delta"] for each in chunks) == "Paris"
    assert chunks[-1]["done"] is True and chunks[-1]["usage"]["completion_tokens"] == 3
    assert h.body() == {"prompt": "Q:", "max_new_tokens": 8, "temperature": 0.0, "stream": True}
    assert h.requests[0].headers["accept"] == "text/event-stream"
    assert h.client.last_model_revision == "r1"


async def test_an_error_event_after_text_raises_and_is_not_retried(harness):
    error = {"code": "INTERNAL_ERROR", "message": "worker died", "type": "server_error", "param": None}
    failing = {"request_id": "req-1", "done": True, "finish_reason": "error", "error": error}
    h = harness([streamed(chunk(0, "Par"), failing, "data: [DONE]\n\n")])
    received: list[dict[str, Any]] = []
    with pytest.raises(ServerError) as caught:
        await h.stream(received, MODEL, "Q:", max_new_tokens=8)
    assert [each["text_delta"] for each in received] == ["Par"]
    assert caught.value.code == "INTERNAL_ERROR" and str(caught.value) == "worker died"
    assert len(h.requests) == 1


async def test_a_capacity_error_event_before_any_chunk_is_retried(harness):
    error = {"code": "RESOURCE_EXHAUSTED", "message": "out of memory", "retry_after_s": 2}
    h = harness([streamed({"error": error}), streamed(chunk(0, "Paris"), last(1), "data: [DONE]\n\n")])
    chunks = await h.stream([], MODEL, "Q:", max_new_tokens=8)
    assert [each["text_delta"] for each in chunks] == ["Paris", ""]
    assert h.sleeps == [2.0] and h.client.last_retry_count == 1


async def test_a_refused_stream_is_retried_only_for_pre_execution_signals(harness):
    h = harness([failure(503, "MODEL_LOADING", "3"), streamed(chunk(0, "Paris"), last(1), "data: [DONE]\n\n")])
    chunks = await h.stream([], MODEL, "Q:", max_new_tokens=8)
    assert len(chunks) == 2 and h.sleeps == [3.0]

    h = harness([failure(504, "GATEWAY_TIMEOUT", "1")])
    with pytest.raises(ServerError) as caught:
        await h.stream([], MODEL, "Q:", max_new_tokens=8)
    assert caught.value.status_code == 504 and len(h.requests) == 1

    h = harness([openai_error(404, "Model 'acme/none' not found", "model_not_found", "model")])
    with pytest.raises(RequestError, match="acme/none"):
        await h.stream([], "acme/none", "Q:", max_new_tokens=8)


async def test_a_stream_cut_mid_way_raises_a_connection_error_without_a_retry(harness):
    h = harness([httpx.Response(200, stream=CutStream(events(chunk(0, "Par"))))])
    received: list[dict[str, Any]] = []
    with pytest.raises(SIEConnectionError) as caught:
        await h.stream(received, MODEL, "Q:", max_new_tokens=8)
    assert isinstance(caught.value.__cause__, httpx.ReadError)
    assert [each["text_delta"] for each in received] == ["Par"]
    assert len(h.requests) == 1 and h.sleeps == []


async def test_a_malformed_event_is_a_request_error(harness):
    h = harness([streamed(chunk(0, "Par"), "data: {not json\n\n")])
    with pytest.raises(RequestError, match="Malformed SSE chunk"):
        await h.stream([], MODEL, "Q:", max_new_tokens=8)


def test_leaving_a_sync_stream_early_closes_its_response():
    closed: list[bool] = []

    class Tracked(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield events(chunk(0, "a"), chunk(1, "b"), chunk(2, "c"))

        def close(self) -> None:
            closed.append(True)

    client = SIEClient(BASE, transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=Tracked())))
    with client:
        for each in client.stream_generate(MODEL, "Q:", max_new_tokens=8):
            assert each["seq"] == 0
            break
        assert closed == [True]  # the gateway sees the disconnect and cancels the generation
