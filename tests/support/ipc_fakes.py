"""A WorkerClient-shaped service for the IPC tests: the seam under test is the socket, so the service
behind it is scripted (`gates` hold a batch back by batch_id; `blob` sizes the outcomes)."""

from __future__ import annotations

import asyncio

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
    WorkerCapabilitiesRequest,
    WorkerCapabilitiesResponse,
)


class FakeService:
    """WorkerClient methods with seams: `gates` hold a batch back by batch_id; `blob` sizes the outcomes."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.blob = b"\x00\x01"
        self.batches: list[RunBatchRequest] = []
        self.cancelled: list[int] = []

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
