"""A WorkerClient-shaped service for the IPC tests: the seam under test is the socket, so the service
behind it is scripted (`gates` hold a batch back by batch_id; `blob` sizes the outcomes; generations yield
`tokens` publish events, an ack and done, and record how each iterator ended)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sie.wire import packb, unpackb, unstructure
from sie.wire.generate import EVENT_ACK, EVENT_DONE, EVENT_PUBLISH, GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc_batch import BatchOutcome, ItemOutcome, RunBatchRequest
from sie.wire.ipc_control import (
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    PingRequest,
    PingResponse,
    ReplaceModelConfigsRequest,
    ReplaceModelConfigsResponse,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
    WorkerCapabilitiesRequest,
    WorkerCapabilitiesResponse,
)
from sie.wire.queue import OPERATION_GENERATE, GenerateParams, WorkItem


def generate_request(generation_id: str, model_id: str = "m") -> ProcessGenerateRequest:
    """A ProcessGenerate for one generation work item whose request id is `generation_id`."""
    item = WorkItem(
        work_item_id=f"{generation_id}.0", request_id=generation_id, item_index=0, total_items=1,
        operation=OPERATION_GENERATE, model_id=model_id, profile_id="default", pool_name="", machine_profile="",
        router_id="router-1", reply_subject=f"_INBOX.{generation_id}", timestamp=0.0,
        generate=GenerateParams(prompt="Hello"),
    )  # fmt: skip
    return ProcessGenerateRequest(model_id=model_id, work_item_msgpack=packb(unstructure(item)))


class FakeService:
    """WorkerClient methods with seams: `gates` hold a batch back by batch_id; `blob` sizes the outcomes."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.blob = b"\x00\x01"
        self.batches: list[RunBatchRequest] = []
        self.cancelled: list[int] = []
        self.tokens = 3  # publish events per generation
        # Generation request id → held after its first publish until set (a cancel sets it too).
        self.generate_gates: dict[str, asyncio.Event] = {}
        self.generate_failures: dict[str, int] = {}  # generation request id → raise after this many publishes
        # How each generation's iterator ended: done | cancelled | failed | closed (aclose, or its task cancelled).
        self.generations: dict[str, str] = {}
        self.cancel_requests: list[str] = []
        self._running: set[str] = set()
        self._cancelling: set[str] = set()

    async def ping(self, request: PingRequest) -> PingResponse:
        return PingResponse(timestamp_ms=request.timestamp_ms, worker_id="fake", ready=True)

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        if request.model_id == "boom":
            raise RuntimeError("boom")
        return EnsureModelReadyResponse(state="loading_started")

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        self.batches.append(request)
        gate = self.gates.get(request.batch_id)
        try:
            if gate is not None:
                await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(request.batch_id)
            raise
        outcomes = [
            ItemOutcome(work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                        disposition="publish_and_ack", result_msgpack=self.blob)
            for item in request.items
        ]  # fmt: skip
        return BatchOutcome(outcomes=outcomes)

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        generation_id = unpackb(request.work_item_msgpack)["request_id"]
        self._running.add(generation_id)
        ended = "closed"
        try:
            for seq in range(self.tokens):
                if generation_id in self._cancelling:
                    break
                chunk = packb({"request_id": generation_id, "seq": seq})
                yield GenerateEvent(kind=EVENT_PUBLISH, reply_subject=f"_INBOX.{generation_id}", payload=chunk)
                gate = self.generate_gates.get(generation_id)
                if seq == 0 and gate is not None:
                    await gate.wait()
                if self.generate_failures.get(generation_id) == seq + 1:
                    ended = "failed"
                    raise RuntimeError(f"decoding {generation_id} failed")
            yield GenerateEvent(kind=EVENT_ACK)
            yield GenerateEvent(kind=EVENT_DONE)
            ended = "cancelled" if generation_id in self._cancelling else "done"
        finally:
            self._running.discard(generation_id)
            self._cancelling.discard(generation_id)
            self.generations[generation_id] = ended

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        self.cancel_requests.append(request.request_id)
        matched = request.request_id in self._running
        if matched:
            self._cancelling.add(request.request_id)
            gate = self.generate_gates.get(request.request_id)
            if gate is not None:
                gate.set()
        return SignalGenerateCancelResponse(matched=matched)

    async def worker_capabilities(self, request: WorkerCapabilitiesRequest) -> WorkerCapabilitiesResponse:
        return WorkerCapabilitiesResponse(
            supports_execution_authority_v1=False, supports_numerical_admission_v1=False, has_generation_models=False,
            generation_models=[], supported_models=["m"], loaded_models=[],
        )  # fmt: skip

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        raise RuntimeError("apply is not scripted")  # the tests' handler-exception case

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        return ReplaceModelConfigsResponse(
            applied=False, bundle_config_hash="", config_version=request.epoch, applied_models=[],
            applied_profiles=[], unsupported_models=[entry.model_id for entry in request.models],
        )  # fmt: skip

    async def drain(self, request: DrainRequest) -> DrainResponse:
        return DrainResponse()
