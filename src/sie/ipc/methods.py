"""The IPC methods the worker's server answers: each name's body type, the service call it makes, whether it
runs in the background (contracts Part A §2.1 "Concurrency") and whether it streams.

The service is anything with the WorkerClient methods; the per-op Process*Batch methods become one RunBatch.
A streaming method's call returns an async iterator instead of an awaitable: each item it yields is one response
frame (ProcessGenerate's GenerateEvents). Names in `sie.wire.ipc.METHODS` that are not here (among them
ProcessGenerateWithExecutionAuthorityV1) are answered "unknown method X".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from sie.ipc.client import WorkerChild, WorkerClient
from sie.wire import ipc
from sie.wire.generate import ProcessGenerateRequest
from sie.wire.ipc_batch import (
    OP_ENCODE,
    OP_EXTRACT,
    OP_SCORE,
    BatchOutcome,
    ProcessEncodeBatchRequest,
    ProcessExtractBatchRequest,
    ProcessScoreBatchRequest,
    RunBatchItem,
    RunBatchRequest,
)
from sie.wire.ipc_control import (
    ApplyModelConfigRequest,
    DrainRequest,
    EnsureModelReadyRequest,
    ModelControlStatusRequest,
    PingRequest,
    ReplaceModelConfigsRequest,
    SignalGenerateCancelRequest,
    UnloadModelRequest,
    WorkerCapabilitiesRequest,
    WorkerMetricsRequest,
)

Call = Callable[[WorkerChild, Any], Awaitable[Any]]
Stream = Callable[[WorkerChild, Any], AsyncIterator[Any]]


@dataclass(frozen=True, slots=True)
class Method:
    """One served method: structure the body as `request_type`, then await `call(service, request)`; a streaming
    method iterates `call(service, request)` instead, answering each item as its own frame (always in the background).
    """

    request_type: type
    call: Call | Stream
    background: bool = False
    streaming: bool = False


def _as_run_batch(op: str, request: Any) -> RunBatchRequest:
    """A per-op batch as the equivalent single-op RunBatch (the worker has one batch path)."""
    items = [
        RunBatchItem(op=op, work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                     **{op: item})
        for item in request.items
    ]  # fmt: skip
    return RunBatchRequest(
        model_id=request.model_id, batch_id=0, lora_key="", total_cost=len(items), items=items,
        accepts_batched_f16_multivectors=getattr(request, "accepts_batched_f16_multivectors", False),
    )  # fmt: skip


def _process_batch(op: str) -> Call:
    async def call(service: WorkerClient, request: Any) -> BatchOutcome:
        return await service.run_batch(_as_run_batch(op, request))

    return call


METHODS: Final[Mapping[str, Method]] = MappingProxyType(
    {
        ipc.PING: Method(PingRequest, lambda service, request: service.ping(request)),
        ipc.ENSURE_MODEL_READY: Method(
            EnsureModelReadyRequest, lambda service, request: service.ensure_model_ready(request)
        ),
        ipc.WORKER_CAPABILITIES: Method(
            WorkerCapabilitiesRequest, lambda service, request: service.worker_capabilities(request)
        ),
        ipc.APPLY_MODEL_CONFIG: Method(
            ApplyModelConfigRequest, lambda service, request: service.apply_model_config(request)
        ),
        ipc.REPLACE_MODEL_CONFIGS: Method(
            ReplaceModelConfigsRequest, lambda service, request: service.replace_model_configs(request)
        ),
        ipc.DRAIN: Method(DrainRequest, lambda service, request: service.drain(request)),
        ipc.MODEL_CONTROL_STATUS: Method(
            ModelControlStatusRequest, lambda service, request: service.model_control_status(request)
        ),
        ipc.WORKER_METRICS: Method(WorkerMetricsRequest, lambda service, request: service.worker_metrics(request)),
        ipc.UNLOAD_MODEL: Method(UnloadModelRequest, lambda service, request: service.unload_model(request)),
        ipc.SIGNAL_GENERATE_CANCEL: Method(
            SignalGenerateCancelRequest, lambda service, request: service.signal_generate_cancel(request)
        ),
        ipc.RUN_BATCH: Method(RunBatchRequest, lambda service, request: service.run_batch(request), background=True),
        ipc.PROCESS_ENCODE_BATCH: Method(ProcessEncodeBatchRequest, _process_batch(OP_ENCODE), background=True),
        ipc.PROCESS_SCORE_BATCH: Method(ProcessScoreBatchRequest, _process_batch(OP_SCORE), background=True),
        ipc.PROCESS_EXTRACT_BATCH: Method(ProcessExtractBatchRequest, _process_batch(OP_EXTRACT), background=True),
        ipc.PROCESS_GENERATE: Method(
            ProcessGenerateRequest,
            lambda service, request: service.process_generate(request),
            background=True,
            streaming=True,
        ),
    }
)
