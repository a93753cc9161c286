"""Generation through the gateway over the loopback queue: a stand-in worker consumes the lane and publishes scripted
GenerateChunks to each item's reply subject, so the seam (queue, inbox, reorder, cancel) and every HTTP shape are
checked: native, chat and completions, buffered and streamed; the public `openai` client parses our answers over a
real server (seed 000 §2; seed 001, Generation).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import openai
import pytest

from launcher import free_port
from sie.catalog import Catalog, load_catalog
from sie.gateway.http.app import GatewaySources, build_gateway_app, collector_of
from sie.gateway.publisher import QueueConsumers
from sie.http.serving import HttpListener, serve_http
from sie.settings import GatewaySettings, LaneSettings
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire.generate import GenerateChunk, GenerationUsage
from sie.wire.queue import WorkItem, WorkResult
from support.gateway_fakes import NoWorkers
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
NATIVE = f"/v1/generate/{SMOL}"
CHAT = {"model": SMOL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
Step = GenerateChunk | WorkResult | asyncio.Event
Script = Callable[[WorkItem], list[Step]]


def chunk(item: WorkItem, seq: int, text: str = "", attempt: str = "att-1", **fields: object) -> GenerateChunk:
    return GenerateChunk(request_id=item.request_id, work_item_id=item.work_item_id, attempt_id=attempt, seq=seq,
                         text_delta=text, **fields)  # fmt: skip


def last(item: WorkItem, seq: int, finish: str = "stop", attempt: str = "att-1", **fields: object) -> GenerateChunk:
    usage = GenerationUsage(prompt_tokens=5, completion_tokens=seq, total_tokens=5 + seq)
    return chunk(item, seq, attempt=attempt, done=True, finish_reason=finish, usage=usage, ttft_ms=12.5,
                 tpot_ms=3.25, worker_id="w-1", **fields)  # fmt: skip


def hello(item: WorkItem) -> list[Step]:
    """A well-behaved worker: 'Hello', ' world' and the terminal chunk, in order."""
    return [chunk(item, 0, "Hello"), chunk(item, 1, " world"), last(item, 2)]


class GenerationWorker:
    """Consumes the default lane; publishes `script(item)` to each item's reply subject (an Event in the script
    holds the rest back until set)."""

    def __init__(self, transport: LoopbackTransport) -> None:
        self.transport = transport
        self.script: Script = hello
        self.items: list[WorkItem] = []

    async def __aenter__(self) -> GenerationWorker:
        consumer = await self.transport.consumer(Lane("default", "default", "default"))
        self._task = asyncio.ensure_future(self._serve(consumer))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _serve(self, consumer) -> None:
        while True:
            for delivery in await consumer.fetch(8, 10.0):
                await delivery.ack()
                self.items.append(delivery.item)
                asyncio.ensure_future(self._play(delivery.item))  # noqa: RUF006 - cancelled with the loop

    async def _play(self, item: WorkItem) -> None:
        for step in self.script(item):
            if isinstance(step, asyncio.Event):
                await step.wait()
            else:
                await self.transport.publish_result(item.reply_subject, step)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")


class Gateway:
    """The app over a loopback transport with the stand-in worker; `cancels` records cancel subjects heard."""

    def __init__(self, catalog: Catalog, **settings: object) -> None:
        self.catalog = catalog
        self.settings = GatewaySettings(**{"request_timeout_s": 5.0, **settings})
        self.cancels: list[str] = []

    async def __aenter__(self) -> Gateway:
        self._stack = contextlib.AsyncExitStack()
        self.transport = await self._stack.enter_async_context(LoopbackTransport())
        await self.transport.subscribe("cancel.>", lambda subject, message: self.cancels.append(subject))
        sources = GatewaySources(lambda: self.catalog, self.transport, QueueConsumers(self.transport), NoWorkers())
        self.app = build_gateway_app(sources, self.settings, LaneSettings(), "gw-g")
        self.worker = await self._stack.enter_async_context(GenerationWorker(self.transport))
        await self._stack.enter_async_context(self.app.router.lifespan_context(self.app))
        asgi = httpx.ASGITransport(app=self.app)
        self.client = await self._stack.enter_async_context(httpx.AsyncClient(transport=asgi, base_url="http://gw"))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    @property
    def waiting(self) -> int:
        return len(collector_of(self.app))


@pytest.fixture()
async def gw(catalog: Catalog) -> AsyncIterator[Gateway]:
    async with Gateway(catalog) as gateway:
        yield gateway


def events(response: httpx.Response) -> list[dict | str]:
    """The `data:` payloads of an SSE body, `[DONE]` kept as the string."""
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.text.endswith("\n\n")
    payloads = [block.removeprefix("data: ") for block in response.text.split("\n\n") if block]
    return [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# --- native ---------------------------------------------------------------------------------------------------


async def test_native_buffered_has_the_sdk_generate_result_shape(gw: Gateway) -> None:
    body = {"prompt": "Once upon", "max_new_tokens": 8, "temperature": 0.5, "stop": ["\n"], "seed": 7}
    response = await gw.client.post(NATIVE, json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "model": SMOL, "text": "Hello world", "finish_reason": "stop", "attempt_id": "att-1", "ttft_ms": 12.5,
        "tpot_ms": 3.25, "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }  # fmt: skip
    assert response.headers["x-sie-request-id"] and response.headers["x-sie-worker"] == "w-1"
    assert "x-total-time" in response.headers and "x-sie-version" in response.headers
    # metered as the public SDK reads it: the prompt's tokens in, the completion's out
    assert (response.headers["x-sie-units-input-tokens"], response.headers["x-sie-units-output-tokens"]) == ("5", "2")
    (item,) = gw.worker.items
    assert (item.operation, item.item_index, item.total_items, item.model_id) == ("generate", 0, 1, SMOL)
    assert (item.generate.prompt, item.generate.max_new_tokens, item.generate.seed) == ("Once upon", 8, 7)
    assert item.reply_subject == f"_INBOX.gw-g.{item.request_id}" and item.deadline > item.timestamp
    assert gw.waiting == 0 and gw.cancels == []


@pytest.fixture(scope="module")
def public_sdk():
    """The public sie-sdk 0.10.1, imported from its wheel in the repository's cache (as the e2e tests read it)."""
    wheel = REPO / ".cache" / "wheels" / "sie_sdk-0.10.1-py3-none-any.whl"
    assert wheel.exists(), f"{wheel} is missing: run `make test` once to download it"
    sys.path.insert(0, str(wheel))
    import sie_sdk  # noqa: PLC0415 - importable only once its wheel is on the path

    return sie_sdk


async def test_the_public_sdk_parses_the_native_buffered_result(gw: Gateway, public_sdk) -> None:
    from sie_sdk.client.sync import _parse_generate_result  # noqa: PLC0415 - from the wheel the fixture put on the path

    response = await gw.client.post(
        f"/v1/generate/{SMOL.replace('/', '__')}", json={"prompt": "x", "max_new_tokens": 2}
    )
    result = _parse_generate_result(response.json())
    assert (result["text"], result["finish_reason"], result["attempt_id"]) == ("Hello world", "stop", "att-1")
    assert result["usage"]["total_tokens"] == 7


async def test_native_stream_events_then_done(gw: Gateway) -> None:
    response = await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 4, "stream": True})
    assert response.status_code == 200
    first, second, final, done = events(response)
    request_id = response.headers["x-sie-request-id"]
    assert first == {"request_id": request_id, "seq": 0, "text_delta": "Hello", "done": False}
    assert second["text_delta"] == " world" and second["seq"] == 1
    assert final == {"request_id": request_id, "seq": 2, "text_delta": "", "done": True, "finish_reason": "stop",
                     "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}, "ttft_ms": 12.5,
                     "tpot_ms": 3.25}  # fmt: skip
    assert done == "[DONE]" and gw.waiting == 0


async def test_chunks_out_of_order_duplicated_and_from_a_second_attempt_arrive_once_in_order(gw: Gateway) -> None:
    gw.worker.script = lambda item: [
        chunk(item, 1, " B", attempt="late"),  # a redelivery's attempt, never seq 0 first
        chunk(item, 1, " world"), chunk(item, 0, "Hello"), chunk(item, 0, "Hello"),
        chunk(item, 0, "Other", attempt="late"), chunk(item, 1, " world"), last(item, 2, attempt="late"),
        last(item, 2, finish="length"),
    ]  # fmt: skip
    response = await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 2, "stream": True})
    texts = [event["text_delta"] for event in events(response)[:-1]]
    assert texts == ["Hello", " world", ""]
    buffered = await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 2})
    assert (buffered.json()["text"], buffered.json()["finish_reason"]) == ("Hello world", "length")


# --- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "retry_after"),
    [("INPUT_TOO_LONG", 400, None), ("RESOURCE_EXHAUSTED", 503, "9"), ("INFERENCE_ERROR", 500, None)],
)
async def test_a_worker_error_before_any_text_is_an_http_error(
    gw: Gateway, code: str, status: int, retry_after: str | None
) -> None:
    gw.worker.script = lambda item: [last(item, 0, finish="error", error="no luck", error_code=code,
                                          retry_after_s=9)]  # fmt: skip
    for path, body in [(NATIVE, {"prompt": "x", "max_new_tokens": 2, "stream": True}),
                       ("/v1/chat/completions", {**CHAT, "stream": True}), ("/v1/chat/completions", CHAT)]:  # fmt: skip
        response = await gw.client.post(path, json=body)
        error = openai_error(response, status)
        assert error["message"] == "no luck" and response.headers.get("retry-after") == retry_after
    assert gw.waiting == 0 and gw.cancels == []  # the worker ended the generation itself


async def test_a_worker_error_after_text_is_a_terminal_event(gw: Gateway) -> None:
    gw.worker.script = lambda item: [
        chunk(item, 0, "Hel"),
        last(item, 1, finish="error", error="oom", error_code="RESOURCE_EXHAUSTED", retry_after_s=3),
    ]
    native = events(await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 4, "stream": True}))
    assert native[0]["text_delta"] == "Hel" and native[-1] == "[DONE]"
    assert native[1]["error"] == {"code": "RESOURCE_EXHAUSTED", "message": "oom", "type": "server_error",
                                  "param": None, "retry_after_s": 3}  # fmt: skip
    chat = events(await gw.client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert chat[-2]["error"]["code"] == "RESOURCE_EXHAUSTED" and chat[-1] == "[DONE]"


async def test_a_sidecar_refusal_as_a_work_result_fails_the_generation(gw: Gateway) -> None:
    gw.worker.script = lambda item: [
        WorkResult(
            work_item_id=item.work_item_id,
            request_id=item.request_id,
            item_index=0,
            success=False,
            error="bad",
            error_code="INVALID_INPUT",
        )
    ]
    assert (
        openai_error(await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 2}), 400)["message"] == "bad"
    )


async def test_no_chunk_within_the_timeout_is_504_then_cancel(catalog: Catalog) -> None:
    async with Gateway(catalog, request_timeout_s=0.2) as gateway:
        gateway.worker.script = lambda item: [asyncio.Event()]
        error = openai_error(await gateway.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 2}), 504)
        assert error["code"] == "GATEWAY_TIMEOUT" and error["type"] == "server_error"
        (item,) = gateway.worker.items
        await eventually(lambda: gateway.cancels == [f"cancel.gw-g.{item.request_id}"])
        assert gateway.waiting == 0


async def test_unknown_and_non_generation_models_and_bad_fields(gw: Gateway) -> None:
    missing = openai_error(await gw.client.post("/v1/chat/completions", json={**CHAT, "model": "acme/none"}), 404)
    assert (missing["code"], missing["param"]) == ("model_not_found", "model")
    refused = openai_error(await gw.client.post("/v1/chat/completions", json={**CHAT, "model": MINILM}), 400)
    assert refused["message"] == f"Model '{MINILM}' does not support generation"
    unsupported = openai_error(await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 2,
                                                                   "grammar": {"regex": "a+"}}), 400)  # fmt: skip
    assert unsupported["param"] == "grammar"
    assert openai_error(await gw.client.post("/v1/completions", content=b"{"), 400)["type"] == "invalid_request_error"
    assert gw.worker.items == []


async def test_more_tokens_than_the_model_allows_is_refused_naming_the_callers_field(gw: Gateway) -> None:
    chat = openai_error(await gw.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5000}), 400)
    assert chat["param"] == "max_tokens"
    assert (
        chat["message"]
        == f"Field 'max_tokens' must be at most 1024 for model '{SMOL}' (its max_output_tokens), got 5000"
    )
    newer = {**CHAT, "max_completion_tokens": 2048}
    assert (
        openai_error(await gw.client.post("/v1/chat/completions", json=newer), 400)["param"] == "max_completion_tokens"
    )
    native = openai_error(await gw.client.post(NATIVE, json={"prompt": "x", "max_new_tokens": 1025}), 400)
    assert native["param"] == "max_new_tokens"
    assert gw.worker.items == []


async def test_a_prompt_over_the_item_limit_is_input_too_long_before_anything_is_queued(catalog: Catalog) -> None:
    async with Gateway(catalog, max_item_chars=50) as gateway:
        long_prompt = {"prompt": "x" * 51, "max_new_tokens": 2}
        response = await gateway.client.post(NATIVE, json=long_prompt)
        assert response.headers["x-sie-error-code"] == "INPUT_TOO_LONG"  # what SIE clients type it by
        native = openai_error(response, 400)
        assert native["message"].startswith("The text of the prompt has 51 characters; at most 50")
        chat = {**CHAT, "messages": [{"role": "system", "content": "y" * 30}, {"role": "user", "content": "z" * 30}]}
        refused = openai_error(await gateway.client.post("/v1/chat/completions", json=chat), 400)
        assert "has 60 characters" in refused["message"]
        assert gateway.worker.items == []


# --- OpenAI shapes --------------------------------------------------------------------------------------------


async def test_chat_buffered_and_streamed_with_usage(gw: Gateway) -> None:
    body = (await gw.client.post("/v1/chat/completions", json=CHAT)).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion" and body["model"] == SMOL
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello world"},
                                "finish_reason": "stop", "logprobs": None}]  # fmt: skip
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert gw.worker.items[0].generate.messages == [{"role": "user", "content": "Say hi"}]
    streamed = events(
        await gw.client.post(
            "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        )
    )
    *chunks, usage, done = streamed
    assert done == "[DONE]" and {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in [*chunks, usage]}) == 1
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {"content": "Hello"},
                                                         {"content": " world"}, {}]  # fmt: skip
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 7


async def test_completions_buffered_and_streamed(gw: Gateway) -> None:
    body = (await gw.client.post("/v1/completions", json={"model": SMOL, "prompt": "Once"})).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"text": "Hello world", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert gw.worker.items[0].generate.max_new_tokens == 16
    streamed = events(await gw.client.post("/v1/completions", json={"model": SMOL, "prompt": "x", "stream": True}))
    assert [e["choices"][0]["text"] for e in streamed[:-1]] == ["Hello", " world", ""]
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop" and streamed[-1] == "[DONE]"


async def test_models_list_the_generate_task(gw: Gateway) -> None:
    info = (await gw.client.get(f"/v1/models/{SMOL}")).json()
    assert info["tasks"] == ["generate"] and info["capabilities"]["streaming"] is True
    assert "capabilities" not in (await gw.client.get(f"/v1/models/{MINILM}")).json()


# --- over a real server: disconnects and the openai client ------------------------------------------------------


@contextlib.asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[str]:
    listener = HttpListener("127.0.0.1", free_port(), grace_s=2.0, server="uvicorn")
    stop = asyncio.Event()
    server = asyncio.ensure_future(serve_http(gateway.app, listener, stop))
    url = f"http://127.0.0.1:{listener.port}"
    try:
        async with httpx.AsyncClient(base_url=url) as client:

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await client.get("/readyz")).status_code == 200
                return False

            await eventually(ready, timeout_s=10.0, what="the server to answer")
        yield url
    finally:
        stop.set()
        await server


async def test_a_client_leaving_mid_stream_publishes_the_cancel(gw: Gateway) -> None:
    hold = asyncio.Event()
    gw.worker.script = lambda item: [chunk(item, 0, "Hello"), hold, last(item, 1)]
    async with served(gw) as url, httpx.AsyncClient(base_url=url) as client:
        body = {"prompt": "x", "max_new_tokens": 4, "stream": True}
        async with client.stream("POST", NATIVE, json=body) as response:
            lines = response.aiter_lines()
            assert json.loads((await anext(lines)).removeprefix("data: "))["text_delta"] == "Hello"
        (item,) = gw.worker.items
        await eventually(lambda: gw.cancels == [f"cancel.gw-g.{item.request_id}"], what="the cancel")
        await eventually(lambda: gw.waiting == 0, what="the stream to be forgotten")
        hold.set()


async def test_the_openai_client_parses_chat_completions(gw: Gateway) -> None:
    async with served(gw) as url, openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        messages = [{"role": "user", "content": "Say hi"}]
        completion = await client.chat.completions.create(model=SMOL, messages=messages, max_tokens=8)
        assert completion.choices[0].message.content == "Hello world"
        assert completion.choices[0].finish_reason == "stop" and completion.usage.total_tokens == 7
        stream = await client.chat.completions.create(
            model=SMOL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
        assert chunks[-1].usage.completion_tokens == 2
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="acme/none", messages=messages)
        gw.worker.script = lambda item: [chunk(item, 0, "Hel"), last(item, 1, finish="error", error="boom",
                                                                      error_code="INFERENCE_ERROR")]  # fmt: skip
        with pytest.raises(openai.APIError, match="boom"):
            [c async for c in await client.chat.completions.create(model=SMOL, messages=messages, stream=True)]


async def test_the_public_sdk_generates_and_streams_over_a_server(gw: Gateway, public_sdk) -> None:
    def calls(url: str) -> tuple[dict, list[dict]]:
        client = public_sdk.SIEClient(url)
        try:
            result = client.generate(SMOL, "Once", max_new_tokens=4)
            return result, list(client.stream_generate(SMOL, "Once", max_new_tokens=4))
        finally:
            client.close()

    async with served(gw) as url:
        result, chunks = await asyncio.to_thread(calls, url)
    assert (result["text"], result["ttft_ms"]) == ("Hello world", 12.5)
    assert [c["text_delta"] for c in chunks] == ["Hello", " world", ""] and chunks[-1]["done"] is True


# --- the Responses API --------------------------------------------------------------------------------------


def named_events(response: httpx.Response) -> list[tuple[str, dict]]:
    """The `(event, data)` pairs of a Responses SSE body: every block names its event, which its data's `type`
    repeats; no `[DONE]`."""
    assert response.headers["content-type"].startswith("text/event-stream")
    pairs = []
    for block in response.text.split("\n\n"):
        if block:
            event_line, data_line = block.split("\n")
            pairs.append((event_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    assert all(name == data["type"] for name, data in pairs)
    assert [data["sequence_number"] for _, data in pairs] == list(range(len(pairs)))
    return pairs


RESPONSE = {"model": SMOL, "input": "Say hi", "instructions": "Be brief", "max_output_tokens": 8}


async def test_responses_buffered_and_streamed(gw: Gateway) -> None:
    body = (await gw.client.post("/v1/responses", json=RESPONSE)).json()
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["status"] == "completed"
    (message,) = body["output"]
    assert message["role"] == "assistant" and message["content"][0]["text"] == "Hello world"
    assert body["usage"]["input_tokens"] == 5 and body["usage"]["output_tokens"] == 2
    assert body["usage"]["total_tokens"] == 7 and body["max_output_tokens"] == 8
    item = gw.worker.items[0].generate
    assert item.messages == [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Say hi"}]
    assert item.max_new_tokens == 8
    pairs = named_events(await gw.client.post("/v1/responses", json={**RESPONSE, "stream": True}))
    assert [name for name, _ in pairs] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [data["delta"] for name, data in pairs if name == "response.output_text.delta"] == ["Hello", " world"]
    assert pairs[-1][1]["response"]["output"][0]["content"][0]["text"] == "Hello world"
    assert pairs[0][1]["response"]["status"] == "in_progress"


async def test_responses_cut_by_max_output_tokens_are_incomplete_and_input_lists_are_read(gw: Gateway) -> None:
    gw.worker.script = lambda item: [chunk(item, 0, "Hello"), last(item, 1, finish="length")]
    conversation = [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Again"}]},
    ]
    body = (await gw.client.post("/v1/responses", json={"model": SMOL, "input": conversation})).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert gw.worker.items[0].generate.messages == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": SMOL}, "input"),
        ({"model": SMOL, "input": []}, "input"),
        ({"model": SMOL, "input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
        ({"model": SMOL, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"model": SMOL, "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": SMOL, "input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"model": SMOL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": SMOL, "input": "x", "instructions": 3}, "instructions"),
        ({"model": SMOL, "input": "x", "frobnicate": 1}, "frobnicate"),
    ],
)
async def test_responses_refusals_name_the_field(gw: Gateway, body: dict, param: str) -> None:
    error = openai_error(await gw.client.post("/v1/responses", json=body), 400)
    assert error["param"] == param, error


async def test_responses_that_ask_for_nothing_unsupported_are_served(gw: Gateway) -> None:
    body = {**RESPONSE, "tools": [], "tool_choice": "auto", "text": {"format": {"type": "text"}}, "store": False,
            "truncation": "disabled", "metadata": {"k": "v"}, "user": "u1"}  # fmt: skip
    assert (await gw.client.post("/v1/responses", json=body)).status_code == 200


async def test_a_worker_error_after_text_is_a_response_failed_event(gw: Gateway) -> None:
    gw.worker.script = lambda item: [chunk(item, 0, "Hel"), last(item, 1, finish="error", error="oom",
                                                                  error_code="RESOURCE_EXHAUSTED")]  # fmt: skip
    pairs = named_events(await gw.client.post("/v1/responses", json={**RESPONSE, "stream": True}))
    name, failed = pairs[-1]
    assert name == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "RESOURCE_EXHAUSTED", "message": "oom"}


async def test_the_openai_client_parses_responses(gw: Gateway) -> None:
    async with served(gw) as url, openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        response = await client.responses.create(model=SMOL, input="Say hi", instructions="Be brief")
        assert response.output_text == "Hello world" and response.status == "completed"
        assert response.usage.output_tokens == 2
        stream = await client.responses.create(model=SMOL, input="Say hi", stream=True)
        events = [event async for event in stream]
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello world"
        assert events[-1].type == "response.completed" and events[-1].response.output_text == "Hello world"
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="acme/none", input="x")
