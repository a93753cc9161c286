"""DecoderRun (sie.worker.generation.decoder_run) on a tiny converted llama decoder: the same logits and cache as
`session.run`, the cache left as onnxruntime values that the next step takes as they are, and a batch whose cache
stays there until rows join or leave (kv_cache.BatchCache)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from sie.worker.generation.decoder_run import DecoderRun, device_of
from sie.worker.generation.kv_cache import BatchCache, CacheShape, next_cache
from support.llama_reference import tiny_decoder_session


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[ort.InferenceSession, CacheShape]:
    return tiny_decoder_session(tmp_path_factory.mktemp("tiny"))


def plain_run(session: ort.InferenceSession, feeds: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    names = [output.name for output in session.get_outputs()]
    outputs = session.run(None, {name: np.asarray(value) for name, value in feeds.items()})
    return outputs[names.index("logits")], next_cache(names, outputs)


def test_a_prefill_and_steps_give_what_session_run_gives_and_the_cache_stays_with_onnxruntime(decoder) -> None:
    session, shape = decoder
    run = DecoderRun(session)
    feeds = BatchCache.prompt_feeds([np.asarray([1, 40, 41, 42]), np.asarray([5, 6])], shape)
    logits, present = run(feeds)
    expected_logits, expected = plain_run(session, feeds)
    assert np.array_equal(logits, expected_logits)
    assert all(isinstance(value, ort.OrtValue) for value in present.values())
    assert {name: value.numpy().tolist() for name, value in present.items()} == {
        name: value.tolist() for name, value in expected.items()
    }
    batch, host = BatchCache(present, feeds["attention_mask"]), BatchCache(expected, feeds["attention_mask"])
    for token in (7, 8, 9):  # each step feeds the last step's values back as they are
        logits, present = run(batch.step_feeds([token, token + 1]))
        expected_logits, expected = plain_run(session, host.step_feeds([token, token + 1]))
        assert np.allclose(logits, expected_logits, atol=1e-6, rtol=0)
        batch, host = batch.advanced(present), host.advanced(expected)
        assert all(isinstance(value, ort.OrtValue) for value in batch.past.values())


def test_rows_joining_and_leaving_bring_the_cache_to_the_host(decoder) -> None:
    session, shape = decoder
    run = DecoderRun(session)
    first_feeds = BatchCache.prompt_feeds([np.asarray([1, 2, 3, 4, 5])], shape)
    second_feeds = BatchCache.prompt_feeds([np.asarray([9, 8]), np.asarray([7, 6, 5])], shape)
    first = BatchCache(run(first_feeds)[1], first_feeds["attention_mask"])
    second = BatchCache(run(second_feeds)[1], second_feeds["attention_mask"])
    assert BatchCache.empty(shape).join(first) is first  # a batch's first rows: their cache stays where it is
    host_first = BatchCache(plain_run(session, first_feeds)[1], first_feeds["attention_mask"])
    host_second = BatchCache(plain_run(session, second_feeds)[1], second_feeds["attention_mask"])
    joined, host_joined = first.join(second), host_first.join(host_second)
    kept, host_kept = joined.keep([2, 0]), host_joined.keep([2, 0])
    for ours, theirs in ((joined, host_joined), (kept, host_kept)):
        assert np.array_equal(ours.mask, theirs.mask)
        for name, value in ours.past.items():
            assert isinstance(value, np.ndarray) and np.array_equal(value, theirs.past[name])


def test_a_cpu_session_keeps_its_cache_in_host_memory(decoder) -> None:
    session, _ = decoder
    assert device_of(session) == ("cpu", 0)


class _CudaSession:
    """What device_of reads of a session on the CUDA provider (none runs here)."""

    def __init__(self, options: dict) -> None:
        self._options = options

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def get_provider_options(self) -> dict:
        return {"CUDAExecutionProvider": self._options, "CPUExecutionProvider": {}}


def test_a_cuda_session_keeps_its_cache_on_its_own_gpu() -> None:
    assert device_of(_CudaSession({"device_id": "1"})) == ("cuda", 1)  # onnxruntime reports options as strings
    assert device_of(_CudaSession({})) == ("cuda", 0)
