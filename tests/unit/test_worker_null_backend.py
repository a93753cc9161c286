"""The null backend: always ready, one tiny result per item, nothing loaded."""

from __future__ import annotations

from pathlib import Path

from sie.catalog import load_catalog
from sie.wire.ipc_batch import DISPOSITION_PUBLISH_AND_ACK, EncodeBatchItem, RunBatchItem, RunBatchRequest
from sie.wire.ipc_control import EnsureModelReadyRequest, PingRequest
from sie.worker.null_backend import NullWorkerService

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
