"""Text generation end to end (issue 17) on the real SmolLM2-135M-Instruct through the session's `sie run --role all`:
the public `openai` client's chat completions with and without streaming, the public sie-sdk's `generate` and
`stream_generate`, `/v1/completions` with stop strings, max_tokens and seeded sampling, a cancelled stream freeing its
sequence, and `/v1/models` listing the model's task. Marked slow: the first request loads a 538 MB decoder.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from support.polling import holds_within

pytestmark = pytest.mark.slow

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# The same question as a raw prompt: ChatML with an open assistant turn (native /v1/generate applies no template).
FRANCE_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
STORY_PROMPT = "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def client(all_server: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{all_server}/v1", api_key="unused", timeout=120, max_retries=0) as opened:
        yield opened


def test_openai_chat_completion_answers_paris(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=32)
    (choice,) = reply.choices
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    usage = reply.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens < 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.model == MODEL and reply.object == "chat.completion"


def test_chat_template_switches_go_through_the_openai_clients_extra_body(client: openai.OpenAI) -> None:
    """vLLM's and sglang's `chat_template_kwargs`: the switches the public server passes reach the template (SmolLM2's
    takes none, so the answer is the same), any other is a 400 naming the field."""
    asked = {"model": MODEL, "messages": FRANCE, "temperature": 0, "max_tokens": 32}
    plain = client.chat.completions.create(**asked)
    switched = client.chat.completions.create(**asked, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert switched.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**asked, extra_body={"chat_template_kwargs": {"tools": []}})
    assert refused.value.body["param"] == "chat_template_kwargs"


def test_openai_streamed_chat_completion(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=32, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    with_choices = [chunk for chunk in chunks if chunk.choices]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in with_choices)
    assert "Paris" in text
    assert len(with_choices) > 3  # streamed in pieces, not one block
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert all(chunk.choices[0].finish_reason is None for chunk in with_choices[:-1])
    usage = chunks[-1].usage  # include_usage: a last chunk with no choices carries the usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens > 0
    # The buffered answer is the same text: greedy decoding does not depend on streaming.
    buffered = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=32)
    assert buffered.choices[0].message.content == text


def test_public_sdk_generate_and_stream_generate(all_server: str, public_sdk) -> None:
    sdk = public_sdk.SIEClient(all_server)
    try:
        result = sdk.generate(MODEL, FRANCE_PROMPT, max_new_tokens=24, temperature=0.0)
        assert "Paris" in result["text"]
        assert result["finish_reason"] == "stop"
        assert result["usage"]["completion_tokens"] > 0 and result["ttft_ms"] > 0
        pieces = list(sdk.stream_generate(MODEL, FRANCE_PROMPT, max_new_tokens=24, temperature=0.0))
        assert "".join(piece.get("text_delta", "") for piece in pieces) == result["text"]
        assert [piece["seq"] for piece in pieces] == sorted(piece["seq"] for piece in pieces)
        assert pieces[-1]["done"] is True and pieces[-1]["finish_reason"] == "stop"
    finally:
        sdk.close()


def test_completions_stop_strings_max_tokens_and_seeded_sampling(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt=FRANCE_PROMPT, temperature=0, max_tokens=32)
    assert "Paris" in whole.choices[0].text
    stopped = client.completions.create(model=MODEL, prompt=FRANCE_PROMPT, temperature=0, max_tokens=32, stop=["Paris"])
    assert stopped.choices[0].finish_reason == "stop"
    assert "Paris" not in stopped.choices[0].text
    assert whole.choices[0].text.startswith(stopped.choices[0].text)
    short = client.completions.create(model=MODEL, prompt=STORY_PROMPT, temperature=0, max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    sampled = [
        client.completions.create(model=MODEL, prompt=STORY_PROMPT, temperature=1.0, seed=11, max_tokens=24)
        for _ in range(2)
    ]
    assert sampled[0].choices[0].text == sampled[1].choices[0].text
    other = client.completions.create(model=MODEL, prompt=STORY_PROMPT, temperature=1.0, seed=12, max_tokens=24)
    greedy = client.completions.create(model=MODEL, prompt=STORY_PROMPT, temperature=0, max_tokens=24)
    # Two seeds or sampling against greedy: at least one of them differs (24 sampled tokens at temperature 1).
    assert {other.choices[0].text, greedy.choices[0].text} != {sampled[0].choices[0].text}


def test_models_list_the_generation_task(all_server: str) -> None:
    listed = httpx.get(f"{all_server}/v1/models", timeout=10).json()
    entries = listed["data"] if isinstance(listed, dict) and "data" in listed else listed["models"]
    (entry,) = [entry for entry in entries if MODEL in (entry.get("id"), entry.get("name"))]
    assert "generate" in str(entry)


def test_unknown_and_non_generation_models_answer_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="acme/nothing-here", messages=FRANCE, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="sentence-transformers/all-MiniLM-L6-v2", messages=FRANCE, max_tokens=4)
    assert "generation" in str(refused.value)


def active_sequences(base_url: str) -> float:
    """`sie_worker_generation_sequences` summed over its series on the server's /metrics (0 when absent)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sie_worker_generation_sequences") and not line.startswith("#")
    ]
    return sum(values)


def test_a_cancelled_stream_frees_its_sequence(all_server: str) -> None:
    url = f"{all_server}/v1/generate/{MODEL.replace('/', '__')}"
    body = {"prompt": STORY_PROMPT, "max_new_tokens": 800, "temperature": 0, "stream": True}
    decoding_while_read = 0.0
    with httpx.Client(timeout=60) as http, http.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        received = 0
        for line in response.iter_lines():
            received += line.startswith("data: {")
            if received == 3:
                decoding_while_read = active_sequences(all_server)
                break  # leaving the line iterator closes the response: the client is gone
    assert decoding_while_read >= 1  # it was still decoding while we read
    # The client left after 3 of up to 800 tokens: the gateway cancels, the worker drops the sequence.
    assert holds_within(lambda: active_sequences(all_server) == 0, timeout_s=10), "the sequence was not freed"


async def test_our_client_generates_streams_and_awaits_the_same_text(all_server: str) -> None:
    from sie.client import SIEAsyncClient, SIEClient  # our own client (the public sie-sdk's is tested above)

    with SIEClient(all_server) as client:
        result = client.generate(MODEL, FRANCE_PROMPT, max_new_tokens=24, temperature=0.0)
        assert "Paris" in result["text"]
        assert result["finish_reason"] == "stop" and result["usage"]["completion_tokens"] > 0
        pieces = list(client.stream_generate(MODEL, FRANCE_PROMPT, max_new_tokens=24, temperature=0.0))
    assert "".join(piece["text_delta"] for piece in pieces) == result["text"]
    assert pieces[-1]["done"] is True and pieces[-1]["finish_reason"] == "stop"
    async with SIEAsyncClient(all_server) as client:
        awaited = await client.generate(MODEL, FRANCE_PROMPT, max_new_tokens=24, temperature=0.0)
    assert awaited["text"] == result["text"]
