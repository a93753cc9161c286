"""Response headers in one place: the header names, the version headers (the SIE wire level) on every answer, a
served request's stage timings rendered as `x-*-time` headers (TEI ResponseMetadata; seed 000 §16.2, contracts
Part B §1.8), and the units it was metered in as `x-sie-units-*` (what the public SDK reads into a result's
`request.usage`).
"""

from __future__ import annotations

import importlib.metadata
from typing import Final

from sie.gateway.metadata import ResponseMetadata
from sie.wire.http import UNIT_HEADERS


def _version() -> str:
    try:
        return importlib.metadata.version("sie")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


SIE_VERSION: Final = _version()
# The SIE wire level this server implements: the public SIE release whose HTTP, SDK and queue contracts it
# speaks (reference/contracts.md). SDKs compare their own version with X-SIE-Server-Version (sie-sdk warns
# when the minor versions are more than one apart), so the version headers carry this, not SIE_VERSION.
SIE_WIRE_LEVEL: Final = "0.10.1"
# HTTP header names are case-insensitive; we emit them lowercase, as the seed's gateway does.
REQUEST_ID: Final = "x-sie-request-id"
ERROR_CODE: Final = "x-sie-error-code"
RETRY_AFTER: Final = "retry-after"
MODEL_REVISION: Final = "x-sie-model-revision"
TRACE_ID: Final = "x-trace-id"
VERSION_HEADERS: Final = {"x-sie-version": SIE_WIRE_LEVEL, "x-sie-server-version": SIE_WIRE_LEVEL}


def response_headers(meta: ResponseMetadata, total_ms: float) -> dict[str, str]:
    """Version, request id, timing (ms, two decimals) and unit headers; optional stages only when they ran."""
    headers = {
        **VERSION_HEADERS,
        REQUEST_ID: meta.request_id,
        "x-queue-publish-time": f"{meta.publish_ms:.2f}",
        "x-queue-wait-time": f"{meta.wait_ms:.2f}",
        "x-queue-time": f"{meta.queue_ms:.2f}",
        "x-tokenization-time": f"{meta.tokenization_ms:.2f}",
        "x-inference-time": f"{meta.inference_ms:.2f}",
        "x-total-time": f"{total_ms:.2f}",
    }
    if meta.postprocessing_ms > 0:
        headers["x-postprocessing-time"] = f"{meta.postprocessing_ms:.2f}"
    if meta.payload_fetch_ms > 0:
        headers["x-payload-fetch-time"] = f"{meta.payload_fetch_ms:.2f}"
    if meta.worker_id:
        headers["x-sie-worker"] = meta.worker_id
    if meta.model_revision:
        headers[MODEL_REVISION] = meta.model_revision
    if meta.trace_id:
        headers[TRACE_ID] = meta.trace_id
    if meta.units is not None:  # each unit sent when not 0; the input tokens whenever a worker metered the request
        for name, header in UNIT_HEADERS.items():
            value = getattr(meta.units, name)
            if value or name == "input_tokens":
                headers[header] = str(value)
    return headers
