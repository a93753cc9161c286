"""What the gateway learnt about one served request on its way: the stage timings (its own publish and wait, the
workers' queue, tokenization, inference and post-processing, the max over the items), the units the workers metered
(summed over the items) and the model revision that executed it (seed 000 §2, §16.2). The HTTP surface renders it
as headers; nothing here knows a header name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from sie.wire.queue import UnitCounts, WorkResult

UNIT_FIELDS: Final = tuple(field.name for field in attrs.fields(UnitCounts))


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
    units: UnitCounts | None = None  # what the workers metered, summed over the items; None when none did


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
    """Gateway timings as measured, worker timings as the max over the items, units their sum (one pass)."""
    meta = ResponseMetadata(request_id, publish_ms, wait_ms)
    metered: list[UnitCounts] = []
    for result in results:
        if result.units is not None:
            metered.append(result.units)
        meta.queue_ms = max(meta.queue_ms, result.queue_ms or 0.0)
        meta.tokenization_ms = max(meta.tokenization_ms, result.tokenization_ms or 0.0)
        meta.inference_ms = max(meta.inference_ms, result.inference_ms or 0.0)
        meta.postprocessing_ms = max(meta.postprocessing_ms, result.postprocessing_ms or 0.0)
        meta.payload_fetch_ms = max(meta.payload_fetch_ms, result.payload_fetch_ms or 0.0)
        if meta.worker_id is None:
            meta.worker_id = result.worker_id
    if len(metered) == 1:
        meta.units = metered[0]
    elif metered:
        meta.units = UnitCounts(**{name: sum(getattr(units, name) for units in metered) for name in UNIT_FIELDS})
    return meta
