"""Generation requests parsed into GenerateCall (native, chat, completions; refusals name their field), the chunk
stream's ordering (reorder buffer, duplicates, competing attempts), worker error chunks as typed failures, and the
error envelope on the three generation paths (seed 000 §2; seed 001, Generation)."""

from __future__ import annotations

import asyncio

import pytest

from sie.gateway.collector import ChunkStream
from sie.gateway.dispatch import chunk_error
from sie.gateway.errors import (
    GatewayTimeoutError,
    GenerationFailedError,
    InvalidRequestError,
    WorkerRetryableError,
)
from sie.gateway.http.generation_requests import parse_chat, parse_completion, parse_native
from sie.gateway.http.replies import Surface, error_reply, stream_error, surface_for_path
from sie.wire.generate import GenerateChunk
from sie.wire.queue import GenerateParams


def chunk(seq: int, text: str = "", attempt: str = "a1", **fields: object) -> GenerateChunk:
    return GenerateChunk(request_id="r", work_item_id="r.0", attempt_id=attempt, seq=seq, text_delta=text, **fields)


# --- parsing --------------------------------------------------------------------------------------------------


def test_native_request_with_every_sampling_field() -> None:
    body = {"prompt": "Once", "max_new_tokens": 8, "temperature": 0, "top_p": 0.9, "top_k": 5, "stop": ["\n"],
            "seed": -3, "stream": True, "options": {"profile": "default"}, "routing_key": "k",
            "prompt_cache_key": "c", "safety_identifier": "s", "frequency_penalty": 0, "presence_penalty": 1.5,
            "logprobs": False}  # fmt: skip
    call = parse_native("org/m", body)
    assert call.model == "org/m" and call.stream and call.profile == "default"
    assert call.params == GenerateParams(prompt="Once", max_new_tokens=8, temperature=0.0, top_p=0.9, top_k=5,
                                         stop=["\n"], seed=-3, presence_penalty=1.5, frequency_penalty=0.0)  # fmt: skip
    # OpenAI's chat and completions requests carry the penalties too
    chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "frequency_penalty": -0.5})
    completion = parse_completion({"model": "m", "prompt": "hi", "presence_penalty": 2})
    assert (chat.params.frequency_penalty, completion.params.presence_penalty) == (-0.5, 2.0)


def test_chat_request_maps_messages_and_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                       {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "x"}],
            "max_tokens": 4, "max_completion_tokens": 6, "stop": "END", "n": 1, "user": "u", "stream": True,
            "stream_options": {"include_usage": True}, "response_format": {"type": "text"}, "tools": []}  # fmt: skip
    call = parse_chat(body)
    assert (call.model, call.stream, call.include_usage) == ("m", True, True)
    assert call.params.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (call.params.max_new_tokens, call.params.stop, call.params.prompt) == (6, ["END"], None)
    assert call.params.chat_template_kwargs is None


def test_chat_template_switches_of_a_chat_request_are_passed_on() -> None:
    """vLLM's and sglang's `chat_template_kwargs` (the OpenAI SDK's `extra_body`), within the public server's set."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": {"enable_thinking": False, "guardian_config": {"risk_name": "harm"}}}  # fmt: skip
    call = parse_chat(body)
    assert call.params.chat_template_kwargs == {"enable_thinking": False, "guardian_config": {"risk_name": "harm"}}


def test_completions_default_to_16_tokens_and_take_a_one_string_list() -> None:
    call = parse_completion({"model": "m", "prompt": ["abc"], "echo": False, "suffix": None})
    assert (call.params.prompt, call.params.max_new_tokens, call.stream) == ("abc", 16, False)


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (lambda b: parse_native("m", b), {"max_new_tokens": 4}, "prompt"),
        (lambda b: parse_native("m", b), {"prompt": "x"}, "max_new_tokens"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": True}, "max_new_tokens"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "images": [{"data": "x"}]}, "images"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "grammar": {"regex": "a"}}, "grammar"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "logprobs": True}, "logprobs"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "lora_adapter": "a"}, "lora_adapter"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "logit_bias": {"1": 2}}, "logit_bias"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "presence_penalty": 2.5},
         "presence_penalty"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "frequency_penalty": "high"},
         "frequency_penalty"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "temperature": -1}, "temperature"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "top_p": 0}, "top_p"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "stop": ["a"] * 5}, "stop"),
        (lambda b: parse_native("m", b), {"prompt": "x", "max_new_tokens": 2, "colour": "red"}, "colour"),
        (parse_chat, {"messages": [{"role": "user", "content": "x"}]}, "model"),
        (parse_chat, {"model": "m", "messages": []}, "messages"),
        (parse_chat, {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "f"}]},
         "tools"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_object"}}, "response_format"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
        (parse_chat, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs"),
        (parse_completion, {"model": "m", "prompt": ["a", "b"]}, "prompt"),
        (parse_completion, {"model": "m", "prompt": "a", "echo": True}, "echo"),
        (parse_completion, {"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
    ],
)  # fmt: skip
def test_refusals_name_their_field(parse, body: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse(body)
    assert caught.value.extra["param"] == param
    reply = error_reply(caught.value, Surface.OPENAI)
    assert reply.status == 400
    assert reply.body["error"]["type"] == "invalid_request_error" and reply.body["error"]["param"] == param


@pytest.mark.parametrize("path", ["/v1/generate/org/m", "/v1/chat/completions", "/v1/completions"])
def test_generation_paths_use_the_openai_envelope(path: str) -> None:
    assert surface_for_path(path) is Surface.OPENAI
    assert surface_for_path("/v1/encode/org/m") is Surface.NATIVE


# --- the chunk stream -----------------------------------------------------------------------------------------


async def drain(stream: ChunkStream) -> list[GenerateChunk]:
    chunks = [await stream.next(1.0)]
    while not chunks[-1].done:
        chunks.append(await stream.next(1.0))
    return chunks


async def test_out_of_order_chunks_come_out_in_seq_order_and_duplicates_are_dropped() -> None:
    stream = ChunkStream("r")
    for seq, text in [(2, "c"), (0, "a"), (2, "c"), (1, "b"), (0, "a"), (3, "")]:
        stream.add(chunk(seq, text, done=seq == 3))
    chunks = await drain(stream)
    assert [(c.seq, c.text_delta) for c in chunks] == [(0, "a"), (1, "b"), (2, "c"), (3, "")]
    assert stream.finished and stream.attempt_id == "a1"


async def test_the_first_attempt_to_deliver_seq_0_wins_even_when_another_came_earlier() -> None:
    stream = ChunkStream("r")
    stream.add(chunk(1, "B1", attempt="b"))  # b's seq 1 arrives first, but a delivers seq 0 first
    stream.add(chunk(1, "A1", attempt="a"))
    stream.add(chunk(0, "A0", attempt="a"))
    stream.add(chunk(0, "B0", attempt="b"))
    stream.add(chunk(2, "", attempt="b", done=True))
    stream.add(chunk(2, "", attempt="a", done=True))
    assert [c.text_delta for c in await drain(stream)] == ["A0", "A1", ""]
    assert stream.attempt_id == "a"


async def test_no_chunk_within_the_timeout_is_a_gateway_timeout() -> None:
    with pytest.raises(GatewayTimeoutError, match="No generated text within 0.05s"):
        await ChunkStream("r").next(0.05)


async def test_a_failure_ends_the_wait_after_the_chunks_released_before_it() -> None:
    stream = ChunkStream("r")
    stream.add(chunk(0, "a"))
    waiter = asyncio.ensure_future(drain(stream))
    await asyncio.sleep(0)
    stream.fail(WorkerRetryableError("busy", code="RESOURCE_EXHAUSTED"))
    with pytest.raises(WorkerRetryableError):
        await waiter


def test_close_forgets_the_stream_once() -> None:
    closed: list[str] = []
    stream = ChunkStream("r", lambda: closed.append("r"))
    stream.close()
    stream.close()
    stream.add(chunk(0, "late"))
    assert closed == ["r"]


# --- worker error chunks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "retry_after_s", "status", "retry_after"),
    [
        ("INVALID_INPUT", None, 400, None),
        ("INPUT_TOO_LONG", None, 400, None),
        ("RESOURCE_EXHAUSTED", 7, 503, "7"),
        ("RESOURCE_EXHAUSTED", 99, 503, "5"),  # out of 1..60: the default
        ("INFERENCE_ERROR", None, 500, None),
    ],
)
def test_error_chunks_map_to_openai_replies(code: str, retry_after_s, status: int, retry_after) -> None:
    error = chunk_error(chunk(0, done=True, finish_reason="error", error="boom", error_code=code,
                              retry_after_s=retry_after_s))  # fmt: skip
    reply = error_reply(error, Surface.OPENAI)
    assert reply.status == status and reply.headers.get("retry-after") == retry_after
    assert reply.body["error"]["message"] == "boom"
    event = stream_error(error)
    assert event["code"] == code and event["message"] == "boom"
    assert ("retry_after_s" in event) == (code == "RESOURCE_EXHAUSTED")


def test_stop_and_length_are_not_errors_and_an_error_finish_without_code_is() -> None:
    assert chunk_error(chunk(3, done=True, finish_reason="stop")) is None
    assert chunk_error(chunk(3, done=True, finish_reason="length")) is None
    assert isinstance(chunk_error(chunk(3, done=True, finish_reason="error")), GenerationFailedError)
