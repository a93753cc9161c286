"""`SIE_WORKER_BACKEND=null`: a worker that answers every batch without running a model, so a benchmark measures
what the gateway → queue → sidecar → IPC path carries on its own: at once, or after `item_time_s` per item
(SIE_NULL_ITEM_TIME_MS, waited without using a CPU) where a benchmark stands it in for a device's run time. It runs no
generation: a ProcessGenerate is answered with one terminal error chunk (INVALID_INPUT), an ack and done.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import numpy as np

from sie.catalog import Catalog
from sie.wire import from_msgpack, to_msgpack
from sie.wire.codes import INVALID_INPUT
from sie.wire.generate import (
    EVENT_ACK,
    EVENT_DONE,
    EVENT_PUBLISH,
    FINISH_ERROR,
    GenerateChunk,
    GenerateEvent,
    ProcessGenerateRequest,
)
from sie.wire.ipc_batch import DISPOSITION_PUBLISH_AND_ACK, BatchOutcome, ItemOutcome, RunBatchRequest
from sie.wire.ipc_control import (
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelControlEntry,
    ModelControlStatusRequest,
    ModelControlStatusResponse,
    ModelDescriptor,
    PingRequest,
    PingResponse,
    ReplaceModelConfigsRequest,
    ReplaceModelConfigsResponse,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
    UnloadModelRequest,
    UnloadModelResponse,
    WorkerCapabilitiesRequest,
    WorkerCapabilitiesResponse,
    WorkerMetricsRequest,
    WorkerMetricsResponse,
)
from sie.wire.payload import ResultBody
from sie.wire.queue import WorkItem

# One result body per operation, shared by every item: read-only values, packed at most once.
_RESULTS = {
    "encode": ResultBody.of({"dense": {"dims": 1, "dtype": "float32", "values": np.zeros(1, dtype=np.float32)}}),
    "score": ResultBody.of([]),
    "extract": ResultBody.of({"entities": [], "relations": [], "classifications": [], "objects": [], "data": {}}),
}


class NullWorkerService:
    """Every catalogue model is always ready; RunBatch returns a one-float result per item, after `item_time_s` per
    item (one batch at a time, as a device runs them)."""

    def __init__(
        self, catalog: Catalog, worker_id: str, batch_budget: int, device: str = "cpu", item_time_s: float = 0.0
    ) -> None:
        self.catalog = catalog
        self.item_time_s = item_time_s
        self._device = asyncio.Lock()
        self.worker_id = worker_id
        self.batch_budget = batch_budget
        self.device = device
        self.counts: dict[str, tuple[int, int]] = {}  # model id → (batches, items) answered
        self.ready_models: set[str] = set()  # the models asked for: "loaded", as Ping reports them

    async def ping(self, request: PingRequest) -> PingResponse:
        return PingResponse(timestamp_ms=request.timestamp_ms, worker_id=self.worker_id, ready=True,
                            loaded_models=sorted(self.ready_models))  # fmt: skip

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        entry = self.catalog.find(request.model_id)
        if entry is None:
            return EnsureModelReadyResponse(state=MODEL_STATE_RETRY_LATER)
        self.ready_models.add(entry.model_id)
        descriptor = ModelDescriptor(supports_run_batch=True, max_concurrent_dispatch=1)
        return EnsureModelReadyResponse(state=MODEL_STATE_READY, batch_budget=self.batch_budget, descriptor=descriptor)

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        started = time.perf_counter()
        if self.item_time_s:
            async with self._device:  # one batch at a time, as on a device
                await asyncio.sleep(self.item_time_s * len(request.items))
        outcomes = [
            ItemOutcome(
                work_item_id=item.work_item_id,
                request_id=item.request_id,
                item_index=item.item_index,
                disposition=DISPOSITION_PUBLISH_AND_ACK,
                result_msgpack=_RESULTS.get(item.op, _RESULTS["encode"]),
                inference_ms=(time.perf_counter() - started) * 1e3,
            )
            for item in request.items
        ]
        batches, items = self.counts.get(request.model_id, (0, 0))
        self.counts[request.model_id] = (batches + 1, items + len(outcomes))
        return BatchOutcome(outcomes=outcomes)

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        """No model generates here: one terminal error chunk to the reply subject, then settle the message."""
        item = from_msgpack(request.work_item_msgpack, WorkItem)
        chunk = GenerateChunk(
            request_id=item.request_id,
            work_item_id=item.work_item_id,
            attempt_id=uuid.uuid4().hex,
            seq=0,
            done=True,
            finish_reason=FINISH_ERROR,
            error=f"Model '{request.model_id}' does not support generation",
            error_code=INVALID_INPUT,
            worker_id=self.worker_id,
        )
        yield GenerateEvent(kind=EVENT_PUBLISH, reply_subject=item.reply_subject, payload=to_msgpack(chunk))
        yield GenerateEvent(kind=EVENT_ACK)
        yield GenerateEvent(kind=EVENT_DONE)

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        return SignalGenerateCancelResponse(matched=False)  # nothing runs here to cancel

    async def worker_capabilities(self, request: WorkerCapabilitiesRequest) -> WorkerCapabilitiesResponse:
        return WorkerCapabilitiesResponse(
            supports_execution_authority_v1=False,
            supports_numerical_admission_v1=False,
            has_generation_models=False,
            generation_models=[],
            supported_models=sorted(self.catalog.entries),
            loaded_models=[],
        )

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        return ApplyModelConfigResponse(applied=False, bundle_config_hash="", unsupported_models=[request.model_id])

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        return ReplaceModelConfigsResponse(
            applied=False, bundle_config_hash="", config_version=request.epoch, applied_models=[],
            applied_profiles=[], unsupported_models=[entry.model_id for entry in request.models],
        )  # fmt: skip

    async def drain(self, request: DrainRequest) -> DrainResponse:
        return DrainResponse(acknowledged=True)

    async def worker_metrics(self, request: WorkerMetricsRequest) -> WorkerMetricsResponse:
        """No model loads, so no series of its own."""
        return WorkerMetricsResponse()

    async def unload_model(self, request: UnloadModelRequest) -> UnloadModelResponse:
        return UnloadModelResponse(unloaded=False, reason="the null backend loads nothing")

    async def model_control_status(self, request: ModelControlStatusRequest) -> ModelControlStatusResponse:
        """Every catalogue model ready, holding no memory and costing no compute."""
        models = []
        for model_id in sorted(self.catalog.entries):
            batches, items = self.counts.get(model_id, (0, 0))
            budget = self.batch_budget
            entry = ModelControlEntry(
                model_id=model_id, state=MODEL_STATE_READY, max_batch_items=budget, batches=batches, items=items
            )
            models.append(entry)
        return ModelControlStatusResponse(worker_id=self.worker_id, device=self.device, ready=True, models=models)
