"""Failures the gateway's domain code raises; each carries its wire code and fields, never a status or envelope.

`sie.gateway.http.replies` maps these (and the catalog, wire and transport errors that reach a handler) onto HTTP. Tree:

    GatewayError
    ├── InvalidRequestError      the request cannot be served as sent (INVALID_INPUT / INPUT_TOO_LONG)
    ├── PayloadTooLargeError     the request body, or a compatibility reply, is over its cap
    ├── RetryableError           try again later: Retry-After and X-SIE-Error-Code
    │   ├── ProvisioningError    no consumer serves the lane (scale from zero)
    │   ├── QueueFullError       the pool stream is over its pending limit or full
    │   ├── QueueUnavailableError  the transport cannot be reached
    │   ├── WorkerRetryableError every item failed with one retryable worker code
    │   ├── ShuttingDownError    the gateway is draining
    │   └── GatewayTimeoutError  published, but no result before the request timeout (also a TimeoutError)
    ├── MachineProfileNotConfiguredError  the request names a machine profile the cluster does not have
    ├── ModelLoadFailedError     every item failed with MODEL_LOAD_FAILED (terminal)
    ├── TransportFailureError    a chunked result failed validation or its memory budget (503, no retry hint)
    ├── AllItemsFailedError      every item failed, with mixed or non-retryable codes
    ├── GenerationFailedError    a generation ended with a worker error that is neither input nor capacity
    ├── ClientDisconnectedError  the caller left before the answer; its work was abandoned
    ├── NotFoundError            an operator route names something that is not there (a dead letter)
    ├── UnauthorizedError        an operator route was called without the admin token it needs
    └── ForbiddenError           an operator route was called with another token than the admin token
"""

from __future__ import annotations

from typing import Any, Final

from sie.wire import codes

# Retry-After defaults in seconds (seed 000 §2): provisioning 60, everything else 5.
PROVISIONING_RETRY_AFTER_S: Final = 60
DEFAULT_RETRY_AFTER_S: Final = 5


class GatewayError(Exception):
    """Base class: a wire `code`, a caller-facing `message`, and diagnostic `extra` fields for the envelope."""

    code: str = codes.INTERNAL_ERROR

    def __init__(self, message: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.extra = extra


class InvalidRequestError(GatewayError):
    """The request names something the model or gateway cannot do; the message names the field or item."""

    code = codes.INVALID_INPUT


class PayloadTooLargeError(GatewayError):
    """A body over `max_body_bytes`, or an OpenAI reply over its 16 MiB buffer."""

    code = codes.PAYLOAD_TOO_LARGE


class RetryableError(GatewayError):
    """A condition that passes: the caller should retry after `retry_after_s` seconds."""

    retry_after_s: int = DEFAULT_RETRY_AFTER_S

    def __init__(
        self, message: str, *, code: str | None = None, retry_after_s: int | None = None, **extra: Any
    ) -> None:
        super().__init__(message, code=code, **extra)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class ProvisioningError(RetryableError):
    """No worker consumes the lane yet; demand is recorded and capacity may be on its way."""

    code = codes.PROVISIONING
    retry_after_s = PROVISIONING_RETRY_AFTER_S


class QueueFullError(RetryableError):
    """Admission refused: the pool stream holds too much pending work (seed 000 §2 backpressure)."""

    code = codes.QUEUE_FULL


class QueueUnavailableError(RetryableError):
    """The queue transport is down; the gateway never falls back to direct dispatch."""

    code = codes.QUEUE_UNAVAILABLE


class WorkerRetryableError(RetryableError):
    """Every item failed with the same retryable worker code (RESOURCE_EXHAUSTED, MODEL_LOADING, LORA_LOADING)."""


class ShuttingDownError(RetryableError):
    """The gateway stopped accepting requests while in-flight ones finish."""

    code = codes.SHUTTING_DOWN


class GatewayTimeoutError(RetryableError, TimeoutError):
    """Work was published but not every result arrived before `request_timeout_s`."""

    code = codes.GATEWAY_TIMEOUT


class MachineProfileNotConfiguredError(GatewayError):
    """`X-SIE-MACHINE-PROFILE` names a profile outside SIE_GATEWAY_CONFIGURED_GPUS (contracts Part B §1.10)."""

    code = codes.GPU_NOT_CONFIGURED

    def __init__(self, machine_profile: str, configured: tuple[str, ...]) -> None:
        super().__init__(
            f"Machine profile '{machine_profile}' is not configured in this cluster; "
            f"configured: {', '.join(configured)}",
            gpu=machine_profile,
            configured_gpu_types=list(configured),
        )


class ModelLoadFailedError(GatewayError):
    """The model cannot be loaded; terminal, so no Retry-After (the SDK must not retry it)."""

    code = codes.MODEL_LOAD_FAILED

    def __init__(self, message: str, *, error_class: str, attempts: int, permanent: bool) -> None:
        super().__init__(message, error_class=error_class, attempts=attempts, permanent=permanent)


class TransportFailureError(GatewayError):
    """A result_chunk_v1 transfer was invalid or over its memory budget (seed 000 §16.2). The message is static:
    the worker's ids, bytes and the validation detail are logged, never shown to the caller."""

    code = codes.TRANSPORT_FAILURE

    def __init__(self) -> None:
        super().__init__("The worker's result could not be received")


class AllItemsFailedError(GatewayError):
    """Every item failed and no single retryable code explains it; `details` lists each item's failure."""

    code = codes.INFERENCE_ERROR

    def __init__(self, message: str, details: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.details = details


class GenerationFailedError(GatewayError):
    """The worker's terminal chunk reported a failure (its `error_code`, else INFERENCE_ERROR)."""

    code = codes.INFERENCE_ERROR


class ClientDisconnectedError(GatewayError):
    """The client closed the connection while its request waited; nobody reads the answer."""

    code = codes.CLIENT_CLOSED_REQUEST


class NotFoundError(GatewayError):
    """An operator route names something that is not there, such as a dead letter id."""

    code = codes.NOT_FOUND


class UnauthorizedError(GatewayError):
    """An operator route needs `Authorization: Bearer <SIE_ADMIN_TOKEN>` and got no token."""

    code = codes.UNAUTHORIZED


class ForbiddenError(GatewayError):
    """An operator route got a token that is not the admin token."""

    code = codes.FORBIDDEN
