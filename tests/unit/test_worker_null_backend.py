"""The null backend: always ready, one tiny result per item, nothing loaded, no generation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sie.catalog import load_catalog
from sie.settings import load_role_settings
from sie.wire import from_msgpack
from sie.wire.generate import GenerateChunk
from sie.wire.ipc_batch import DISPOSITION_PUBLISH_AND_ACK, EncodeBatchItem, RunBatchItem, RunBatchRequest
from sie.wire.ipc_control import EnsureModelReadyRequest, PingRequest, SignalGenerateCancelRequest
from sie.worker.null_backend import NullWorkerService
from support.ipc_fakes import generate_request

REPO = Path(__file__).resolve().parents[2]


async def test_null_backend_answers_without_a_model() -> None:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    service = NullWorkerService(catalog, "w-null", 64)
    ready = await service.ensure_model_ready(EnsureModelReadyRequest(model_id="sentence-transformers/all-MiniLM-L6-v2"))
    assert ready.state == "ready" and ready.batch_budget == 64
    unknown = await service.ensure_model_ready(EnsureModelReadyRequest(model_id="acme/none"))
    assert unknown.state == "retry_later"
    body = EncodeBatchItem(work_item_id="r.0", request_id="r", item_index=0, total_items=1, timestamp=0.0, item={})
    request = RunBatchRequest(
        model_id="m", batch_id=1, lora_key="", total_cost=1, items=[RunBatchItem(op="encode", encode=body)]
    )
    (outcome,) = (await service.run_batch(request)).outcomes
    assert outcome.disposition == DISPOSITION_PUBLISH_AND_ACK
    assert outcome.result_msgpack.value["dense"]["dims"] == 1
    assert (await service.ping(PingRequest(timestamp_ms=1.0))).ready


async def test_null_backend_refuses_generation_with_a_terminal_error_chunk() -> None:
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    service = NullWorkerService(catalog, "w-null", 64)
    events = [event async for event in service.process_generate(generate_request("g1", model_id="acme/lm"))]
    assert [event.kind for event in events] == ["publish", "ack", "done"]
    assert events[0].reply_subject == "_INBOX.g1"
    chunk = from_msgpack(events[0].payload, GenerateChunk)
    assert (chunk.request_id, chunk.work_item_id, chunk.seq, chunk.done) == ("g1", "g1.0", 0, True)
    assert (chunk.finish_reason, chunk.error_code) == ("error", "INVALID_INPUT")
    assert chunk.error == "Model 'acme/lm' does not support generation" and chunk.attempt_id
    cancel = await service.signal_generate_cancel(SignalGenerateCancelRequest(request_id="g1"))
    assert cancel.matched is False


def _batch(items: int) -> RunBatchRequest:
    bodies = [
        EncodeBatchItem(work_item_id=f"r.{i}", request_id="r", item_index=i, total_items=items, timestamp=0.0, item={})
        for i in range(items)
    ]
    return RunBatchRequest(
        model_id="m",
        batch_id=1,
        lora_key="",
        total_cost=items,
        items=[RunBatchItem(op="encode", encode=b) for b in bodies],
    )


async def test_an_item_time_makes_batches_take_it_per_item_one_batch_at_a_time() -> None:
    # SIE_NULL_ITEM_TIME_MS: the device stand-in of scripts/bench/scale.py; two batches of 3 items at 20 ms run one
    # after the other, so the pair takes at least 6 x 20 ms.
    catalog = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    service = NullWorkerService(catalog, "w-null", 64, item_time_s=0.02)
    started = time.perf_counter()
    first, second = await asyncio.gather(service.run_batch(_batch(3)), service.run_batch(_batch(3)))
    assert time.perf_counter() - started >= 6 * 0.02
    assert len(first.outcomes) == len(second.outcomes) == 3


def test_the_item_time_is_a_worker_setting_in_milliseconds() -> None:
    settings = load_role_settings(["--role", "worker", "--backend", "null", "--null-item-time-ms", "8"], {})
    assert settings.worker.null_item_time_s == 0.008
