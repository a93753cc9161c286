"""Response headers in one place: version headers (the SIE wire level) on every answer, and the stage timings
of a served request (TEI ResponseMetadata; seed 000 §16.2, contracts Part B §1.8). Worker timings are the max
over the items.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from typing import Final

import attrs

from sie.wire.queue import WorkResult


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


@attrs.define(slots=True)
class ResponseMetadata:
    """How long each stage of one request took, in milliseconds."""

    request_id: str
    publish_ms: float = 0.0
    wait_ms: float = 0.0
    queue_ms: float = 0.0
    tokenization_ms: float = 0.0
    inference_ms: float = 0.0
    postprocessing_ms: float = 0.0
    payload_fetch_ms: float = 0.0
    worker_id: str | None = None
    model_revision: str | None = None
    trace_id: str | None = None  # the request's trace, when tracing recorded it


def model_revision(expected: str, results: Iterable[WorkResult]) -> str | None:
    """The `X-SIE-Model-Revision` value (seed 000 §2): the hash captured at routing time, only when it is
    non-empty and every item succeeded having executed exactly that hash; None (no header) otherwise."""
    if not expected:
        return None
    seen = False
    for result in results:
        if not result.success or result.executed_bundle_config_hash != expected:
            return None
        seen = True
    return expected if seen else None


def collect_metadata(
    request_id: str, results: Iterable[WorkResult], publish_ms: float, wait_ms: float
) -> ResponseMetadata:
    """Gateway timings as measured, worker timings as the max over the items (one pass)."""
    meta = ResponseMetadata(request_id, publish_ms, wait_ms)
    for result in results:
        meta.queue_ms = max(meta.queue_ms, result.queue_ms or 0.0)
        meta.tokenization_ms = max(meta.tokenization_ms, result.tokenization_ms or 0.0)
        meta.inference_ms = max(meta.inference_ms, result.inference_ms or 0.0)
        meta.postprocessing_ms = max(meta.postprocessing_ms, result.postprocessing_ms or 0.0)
        meta.payload_fetch_ms = max(meta.payload_fetch_ms, result.payload_fetch_ms or 0.0)
        if meta.worker_id is None:
            meta.worker_id = result.worker_id
    return meta


def response_headers(meta: ResponseMetadata, total_ms: float) -> dict[str, str]:
    """Version, request id and timing headers (ms, two decimals); optional stages only when they ran."""
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
    return headers
