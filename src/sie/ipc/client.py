"""The WorkerClient protocol: the IPC methods the sidecar calls (contracts Part A §2.1), typed.

Over a Unix socket they become framed msgpack; in `--role all` the worker's service object satisfies
this protocol itself and the sidecar awaits it directly (DESIGN.md §4).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from sie.wire.generate import GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc_batch import BatchOutcome, RunBatchRequest
from sie.wire.ipc_control import (
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelControlStatusRequest,
    ModelControlStatusResponse,
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


class WorkerClient(Protocol):
    """One worker (one device) as the sidecar sees it."""

    async def ping(self, request: PingRequest) -> PingResponse: ...

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse: ...

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome: ...

    def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        """The events of one generation, in order, the last one `done` (sie.wire.generate)."""
        ...

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse: ...

    async def worker_capabilities(self, request: WorkerCapabilitiesRequest) -> WorkerCapabilitiesResponse: ...

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse: ...

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse: ...

    async def drain(self, request: DrainRequest) -> DrainResponse: ...


class WorkerChild(WorkerClient, Protocol):
    """One worker child of a pod (one device): a WorkerClient that also reports its device, memory and measured
    costs to the sidecar's placement, its metrics to the sidecar's `/metrics`, and unloads a model placement moved
    away from it. A pod of several children is a WorkerClient but no WorkerChild."""

    async def model_control_status(self, request: ModelControlStatusRequest) -> ModelControlStatusResponse: ...

    async def worker_metrics(self, request: WorkerMetricsRequest) -> WorkerMetricsResponse: ...

    async def unload_model(self, request: UnloadModelRequest) -> UnloadModelResponse: ...


async def close_events(events: AsyncIterator[GenerateEvent]) -> None:
    """End a `process_generate` stream before its `done`: an async generator's `aclose()` ends the IPC call and
    cancels the generation; an iterator without one has nothing to end."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()
