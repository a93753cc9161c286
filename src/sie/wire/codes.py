"""Every error code SIE puts on the wire, as constants (contracts Part B §1.7, Part A §2.5–2.6, seeds 000 §2, 001).

Only names live here; which status or envelope carries a code is decided by each surface's error module.
"""

from __future__ import annotations

from typing import Final

# SIE-native HTTP codes (`detail.code` / `error.code`; the sie-server ErrorCode enum).
INVALID_INPUT: Final = "INVALID_INPUT"
MODEL_NOT_FOUND: Final = "MODEL_NOT_FOUND"
MODEL_NOT_LOADED: Final = "MODEL_NOT_LOADED"
LORA_LOADING: Final = "LORA_LOADING"
MODEL_LOADING: Final = "MODEL_LOADING"
MODEL_LOAD_FAILED: Final = "MODEL_LOAD_FAILED"
INFERENCE_ERROR: Final = "INFERENCE_ERROR"
QUEUE_FULL: Final = "QUEUE_FULL"
INTERNAL_ERROR: Final = "INTERNAL_ERROR"
RESOURCE_EXHAUSTED: Final = "RESOURCE_EXHAUSTED"
INPUT_TOO_LONG: Final = "INPUT_TOO_LONG"

# Gateway codes, also sent as the X-SIE-Error-Code header.
PROVISIONING: Final = "PROVISIONING"
GATEWAY_TIMEOUT: Final = "GATEWAY_TIMEOUT"
# Sidecar → gateway: a result too large for one message and no result_chunk_v1 (seed 001).
PAYLOAD_TOO_LARGE: Final = "PAYLOAD_TOO_LARGE"
# Gateway-only codes: broker unreachable, draining on shutdown, bundle override conflict, client gone.
QUEUE_UNAVAILABLE: Final = "QUEUE_UNAVAILABLE"
SHUTTING_DOWN: Final = "SHUTTING_DOWN"
BUNDLE_CONFLICT: Final = "BUNDLE_CONFLICT"
CLIENT_CLOSED_REQUEST: Final = "CLIENT_CLOSED_REQUEST"
# Gateway operator routes (the dead letters, `/v1/dlq`): nothing with that id, no token, not the admin token.
NOT_FOUND: Final = "NOT_FOUND"
UNAUTHORIZED: Final = "UNAUTHORIZED"
FORBIDDEN: Final = "FORBIDDEN"
# A machine profile outside SIE_GATEWAY_CONFIGURED_GPUS: `{"status": "gpu_not_configured", ...}` (contracts B §1.10).
GPU_NOT_CONFIGURED: Final = "gpu_not_configured"
# Gateway → client: a chunked result failed validation; static message, never the worker's detail (seed 000).
TRANSPORT_FAILURE: Final = "transport_failure"

# The queue path writes this lowercase form into ItemOutcome/WorkResult.error_code (contracts Part A §2.1).
QUEUE_INFERENCE_ERROR: Final = "inference_error"

# When every item of a request fails with one of these, the gateway answers 503 with the SDK retry
# envelope instead of 500 all_items_failed (seed 000 §2).
RETRYABLE_WORKER_CODES: Final = frozenset({RESOURCE_EXHAUSTED, MODEL_LOADING, LORA_LOADING})

# OpenAI-compatible envelopes (`error.type` / `error.code`, contracts Part A §2.6).
OPENAI_INVALID_REQUEST_ERROR: Final = "invalid_request_error"
OPENAI_MODEL_NOT_FOUND: Final = "model_not_found"
OPENAI_INVALID_REQUEST: Final = "invalid_request"
