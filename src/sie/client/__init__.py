"""Python SDK for SIE: sync and async clients with the SIE retry contract, wire-compatible with sie-sdk 0.10.1, and
the client of a sidecar's local-ingest socket.

Imports only `sie.wire` among the sie packages; the exception tree is drawn in `sie.client.errors`.
"""

from sie.client._client import SIEAsyncClient, SIEClient
from sie.client._local import LocalIngestClient
from sie.client._retry import compute_oom_backoff
from sie.client.errors import (
    IncompleteBatchError,
    InputTooLongError,
    LoraLoadingError,
    ModelLoadFailedError,
    ModelLoadingError,
    ProvisioningError,
    RateLimitError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEConnectionError,
    SIEError,
    SIETimeoutError,
)

__all__ = [
    "IncompleteBatchError",
    "InputTooLongError",
    "LocalIngestClient",
    "LoraLoadingError",
    "ModelLoadFailedError",
    "ModelLoadingError",
    "ProvisioningError",
    "RateLimitError",
    "RequestError",
    "ResourceExhaustedError",
    "SIEAsyncClient",
    "SIEClient",
    "SIEConnectionError",
    "SIEError",
    "SIETimeoutError",
    "ServerError",
    "compute_oom_backoff",
]
