"""The sidecar ↔ worker IPC envelopes and method names (contracts Part A §2.1).

A frame body is a request envelope, a response envelope or a response chunk; the method bodies live in
ipc_control.py and ipc_batch.py. Framing and chunking logic belong to `sie.ipc`, not here.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

IPC_VERSION: Final = 1
IPC_RESPONSE_CHUNK_KIND: Final = "ipc_response_chunk_v1"
# Bounds of response chunking v1: a frame over 32 MiB needs chunks of at most 4 MiB, 64 chunks, 128 MiB.
IPC_MAX_FRAME_BYTES: Final = 32 * 1024 * 1024
IPC_CHUNK_MAX_PAYLOAD_BYTES: Final = 4 * 1024 * 1024
IPC_CHUNK_MAX_COUNT: Final = 64
IPC_CHUNK_MAX_TOTAL_BYTES: Final = 128 * 1024 * 1024

PING: Final = "Ping"
ENSURE_MODEL_READY: Final = "EnsureModelReady"
PROCESS_ENCODE_BATCH: Final = "ProcessEncodeBatch"
PROCESS_SCORE_BATCH: Final = "ProcessScoreBatch"
PROCESS_EXTRACT_BATCH: Final = "ProcessExtractBatch"
PROCESS_GENERATE: Final = "ProcessGenerate"
WORKER_CAPABILITIES: Final = "WorkerCapabilities"
NUMERICAL_PROFILE_SNAPSHOT: Final = "NumericalProfileSnapshot"
SIGNAL_GENERATE_CANCEL: Final = "SignalGenerateCancel"
RUN_BATCH: Final = "RunBatch"
RUN_BATCH_WITH_EXECUTION_AUTHORITY_V1: Final = "RunBatchWithExecutionAuthorityV1"
PROCESS_GENERATE_WITH_EXECUTION_AUTHORITY_V1: Final = "ProcessGenerateWithExecutionAuthorityV1"
RUN_BATCH_WITH_NUMERICAL_ADMISSION_V1: Final = "RunBatchWithNumericalAdmissionV1"
APPLY_MODEL_CONFIG: Final = "ApplyModelConfig"
REPLACE_MODEL_CONFIGS: Final = "ReplaceModelConfigs"
SET_PINNED_MODELS: Final = "SetPinnedModels"
DRAIN: Final = "Drain"
# Our addition (not in the contract): what the sidecar's placement polls from each worker child.
MODEL_CONTROL_STATUS: Final = "ModelControlStatus"
# Our addition: a worker process's own series, merged into the sidecar's `/metrics`.
WORKER_METRICS: Final = "WorkerMetrics"
# Our addition: placement's compaction unloads a model from a child that no longer holds a replica of it.
UNLOAD_MODEL: Final = "UnloadModel"

METHODS: Final = frozenset(
    {
        PING,
        ENSURE_MODEL_READY,
        PROCESS_ENCODE_BATCH,
        PROCESS_SCORE_BATCH,
        PROCESS_EXTRACT_BATCH,
        PROCESS_GENERATE,
        WORKER_CAPABILITIES,
        NUMERICAL_PROFILE_SNAPSHOT,
        SIGNAL_GENERATE_CANCEL,
        RUN_BATCH,
        RUN_BATCH_WITH_EXECUTION_AUTHORITY_V1,
        PROCESS_GENERATE_WITH_EXECUTION_AUTHORITY_V1,
        RUN_BATCH_WITH_NUMERICAL_ADMISSION_V1,
        APPLY_MODEL_CONFIG,
        REPLACE_MODEL_CONFIGS,
        SET_PINNED_MODELS,
        DRAIN,
        MODEL_CONTROL_STATUS,
        WORKER_METRICS,
        UNLOAD_MODEL,
    }
)


@attrs.frozen(kw_only=True)
class IpcRequest:
    """Request envelope; `body` is the method's message as a map."""

    version: int = IPC_VERSION
    request_id: str
    method: str
    body: dict[str, Any]
    # The worker honours chunking only when this is exactly true.
    accepts_ipc_response_chunks_v1: bool = False


@attrs.frozen(kw_only=True)
class IpcResponse:
    """Response envelope; no `kind` key goes on the wire, `body` and `error` are written even when null."""

    version: int = IPC_VERSION
    request_id: str
    ok: bool
    body: dict[str, Any] | None = None
    error: str | None = None


@attrs.frozen(kw_only=True)
class IpcResponseChunkV1:
    """One ordered slice of a response envelope over 32 MiB; `transfer_digest` is SHA-256 of the whole."""

    version: int = IPC_VERSION
    request_id: str
    transfer_digest: bytes
    chunk_index: int
    chunk_count: int
    total_bytes: int
    payload: bytes
    kind: str = IPC_RESPONSE_CHUNK_KIND
