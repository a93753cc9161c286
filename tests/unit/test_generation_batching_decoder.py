"""Continuous batching of decoder sequences (sie.worker.generation.batching_decoder): the engine on a tiny converted
llama decoder, against the plain greedy loop of sie.worker.generation.greedy_loop."""

from __future__ import annotations

import asyncio
import re
import threading
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from sie.worker.generation.batching_decoder import (
    BatchingDecoder,
    DecodeEvent,
    DecoderLimits,
    SequenceStream,
    prefill_groups,
)
from sie.worker.generation.greedy_loop import greedy_decode
from sie.worker.generation.kv_cache import CacheShape, bytes_per_cached_token
from sie.worker.generation.sampling import SamplingParams
from support.llama_reference import tiny_decoder_session
from support.polling import eventually


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[ort.InferenceSession, CacheShape]:
    return tiny_decoder_session(tmp_path_factory.mktemp("tiny"))


def as_text(ids: object) -> str:
    return "".join(f"<{token}>" for token in ids)


def as_ids(text: str) -> list[int]:
    return [int(token) for token in re.findall(r"<(\d+)>", text)]


async def read_all(stream: SequenceStream) -> tuple[str, DecodeEvent]:
    texts = []
    while not (event := await stream.next()).done:
        texts.append(event.text)
    return "".join(texts) + event.text, event


GREEDY = {"temperature": 0.0}


async def test_batched_sequences_decode_what_each_decodes_alone(decoder) -> None:
    session, shape = decoder
    prompts = [[1, 40, 41], [5, 6, 7, 8, 9, 10, 11, 12], [3, 4], [50, 51, 52, 53, 54]]
    lengths = [6, 9, 12, 4]
    engine = BatchingDecoder(session, shape, as_text, DecoderLimits(max_sequences=2))
    streams = [
        engine.submit(prompt, SamplingParams(max_tokens=length, **GREEDY), f"r{index}", f"s{index}")
        for index, (prompt, length) in enumerate(zip(prompts, lengths, strict=True))
    ]
    results = await asyncio.gather(*(read_all(stream) for stream in streams))
    for prompt, length, (text, last) in zip(prompts, lengths, results, strict=True):
        alone = greedy_decode(session, prompt, shape, length, stop_ids=())
        assert as_ids(text) == list(alone.token_ids)
        assert (last.finish_reason, last.completion_tokens) == ("length", length)
    # Two rows at most: the third and fourth sequences start only once a row has ended.
    first_end = min(results[0][1].last_token_at, results[1][1].last_token_at)
    assert results[2][1].first_token_at >= first_end and results[3][1].first_token_at >= first_end
    await eventually(lambda: engine.running_thread is None)
    assert (engine.active, engine.waiting) == (0, 0)


async def test_the_cache_budget_bounds_the_rows_and_a_sequence_alone_always_runs(decoder) -> None:
    session, shape = decoder
    span = 3 + 6  # prompt + max_tokens: the most columns each row can ever hold
    budget = 2 * span * bytes_per_cached_token(shape)  # two such rows fit, three do not
    engine = BatchingDecoder(session, shape, as_text, DecoderLimits(max_sequences=8, cache_bytes=budget))
    prompts = [[1, 40, 41], [5, 6, 7], [3, 4, 9]]
    streams = [
        engine.submit(prompt, SamplingParams(max_tokens=6, **GREEDY), f"r{index}", f"s{index}")
        for index, prompt in enumerate(prompts)
    ]
    results = await asyncio.gather(*(read_all(stream) for stream in streams))
    for prompt, (text, _) in zip(prompts, results, strict=True):
        assert as_ids(text) == list(greedy_decode(session, prompt, shape, 6, stop_ids=()).token_ids)
    first_end = min(results[0][1].last_token_at, results[1][1].last_token_at)
    assert results[2][1].first_token_at >= first_end  # the third joined only once a row had left
    # Alone, a sequence over the whole budget still runs: its bound is the model's context.
    text, last = await read_all(engine.submit([1, 2], SamplingParams(max_tokens=40, **GREEDY), "big", "big"))
    assert last.finish_reason == "length" and len(as_ids(text)) == 40


def test_decoder_limits_are_positive() -> None:
    with pytest.raises(ValueError, match="cache_bytes"):
        DecoderLimits(cache_bytes=0)
    assert bytes_per_cached_token(CacheShape(layers=30, kv_heads=3, head_dim=64)) == 46_080  # SmolLM2, float32


async def test_a_stop_token_ends_one_row_and_the_others_go_on(decoder) -> None:
    session, shape = decoder
    alone = greedy_decode(session, [1, 40, 41], shape, 8, stop_ids=())
    stop = alone.token_ids[3]
    engine = BatchingDecoder(session, shape, as_text, DecoderLimits(max_sequences=4))
    stopped = engine.submit([1, 40, 41], SamplingParams(max_tokens=8, stop_token_ids={stop}, **GREEDY), "a", "a")
    other = engine.submit([9, 8, 7, 6], SamplingParams(max_tokens=8, **GREEDY), "b", "b")
    (text, last), (other_text, _) = await asyncio.gather(read_all(stopped), read_all(other))
    assert as_ids(text) == list(alone.token_ids[: alone.token_ids.index(stop)])
    assert last.finish_reason == "stop" and last.sampled_tokens == last.completion_tokens + 1
    assert as_ids(other_text) == list(greedy_decode(session, [9, 8, 7, 6], shape, 8, stop_ids=()).token_ids)


async def test_cancelling_waiting_and_running_sequences(decoder) -> None:
    session, shape = decoder
    release = threading.Event()

    def held_decode(ids: object) -> str:
        release.wait(10)  # holds the decode thread inside its first step, so the row is surely running
        return as_text(ids)

    engine = BatchingDecoder(session, shape, held_decode, DecoderLimits(max_sequences=1))
    running = engine.submit([1, 2, 3], SamplingParams(max_tokens=500, **GREEDY), "run", "run")
    queued = engine.submit([4, 5, 6], SamplingParams(max_tokens=500, **GREEDY), "queued", "queued")
    await eventually(lambda: engine.active == 1 and engine.waiting == 1)
    assert engine.cancel("queued") and engine.cancel("run")
    assert not engine.cancel("nobody")
    _, queued_last = await read_all(queued)
    assert (queued_last.finish_reason, queued_last.completion_tokens, queued_last.first_token_at) == (
        "cancelled",
        0,
        None,
    )
    release.set()
    _, running_last = await read_all(running)
    assert running_last.finish_reason == "cancelled" and running_last.completion_tokens < 500
    await eventually(lambda: engine.running_thread is None)
    assert (engine.active, engine.waiting) == (0, 0)


async def test_closing_ends_every_sequence_and_the_thread(decoder) -> None:
    session, shape = decoder
    release = threading.Event()

    def held_decode(ids: object) -> str:
        release.wait(10)
        return as_text(ids)

    engine = BatchingDecoder(session, shape, held_decode, DecoderLimits(max_sequences=1), name="Model 'tiny'")
    running = engine.submit([1, 2, 3], SamplingParams(max_tokens=500, **GREEDY), "run", "run")
    queued = engine.submit([4, 5, 6], SamplingParams(max_tokens=500, **GREEDY), "queued", "queued")
    await eventually(lambda: engine.active == 1)
    thread = engine.running_thread
    engine.close()
    release.set()
    for stream in (running, queued):
        _, last = await read_all(stream)
        assert (last.finish_reason, last.error) == ("error", "Model 'tiny' was unloaded")
    thread.join(5)
    assert not thread.is_alive() and engine.running_thread is None
    # The engine takes new work afterwards (a model still referenced finishes what it is given).
    text, last = await read_all(engine.submit([1, 2], SamplingParams(max_tokens=2, **GREEDY), "late", "late"))
    assert last.finish_reason == "length" and len(as_ids(text)) == 2


def test_at_least_one_row_is_required(decoder) -> None:
    session, shape = decoder
    with pytest.raises(ValueError, match="max_sequences"):
        BatchingDecoder(session, shape, as_text, DecoderLimits(max_sequences=0))


def test_prefill_groups_stay_within_the_padded_token_budget() -> None:
    sequences = [SimpleNamespace(prompt_ids=np.zeros(length)) for length in (10, 30, 5, 60, 200)]
    groups = prefill_groups(sequences, budget=100)  # type: ignore[arg-type]  # only prompt_ids is read
    # 3 rows × 30 fit in 100; a fourth row of 60 would pad to 240; 200 is over the budget alone, so it runs alone.
    assert [[len(sequence.prompt_ids) for sequence in group] for group in groups] == [[10, 30, 5], [60], [200]]
