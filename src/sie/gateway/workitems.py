"""WorkItems from decoded requests: one per item for encode and extract, one per request for score and for
generate (contracts Part B §4.1, seed 000 §16.2). Param placement follows seed 000 §2: encode/extract tuning fields
come from `params`, score reads `instruction`/`options` at the top level. Pure.
"""

from __future__ import annotations

from typing import Any

import attrs

from sie.gateway.router import Route
from sie.telemetry.tracing import TraceHeaders
from sie.wire import unstructure
from sie.wire.http import EncodeRequest, ExtractRequest, Item, ScoreRequest
from sie.wire.queue import (
    OPERATION_DECODE,
    OPERATION_ENCODE,
    OPERATION_EXTRACT,
    OPERATION_GENERATE,
    OPERATION_SCORE,
    OPERATION_TOKENIZE,
    GenerateParams,
    WorkItem,
)


@attrs.frozen
class Ticket:
    """What names one request on the queue: its id, reply subject, router, time bounds (unix seconds) and the W3C
    trace context its work continues (the caller's, or the gateway's span when tracing is on)."""

    request_id: str
    reply_subject: str
    router_id: str
    timestamp: float
    deadline: float
    trace: TraceHeaders | None = None


def _common(route: Route, ticket: Ticket, operation: str, total: int) -> dict[str, Any]:
    return {
        "request_id": ticket.request_id,
        "total_items": total,
        "operation": operation,
        "model_id": route.model_id,
        "profile_id": route.profile,
        "pool_name": route.lane.pool,
        "admission_pool": route.admission_pool or route.lane.pool,
        "machine_profile": route.lane.machine_profile,
        "router_id": ticket.router_id,
        "reply_subject": ticket.reply_subject,
        "timestamp": ticket.timestamp,
        "deadline": ticket.deadline,
        # Captured with the route from one catalogue snapshot; "" (legacy) is sent as absent.
        "bundle_config_hash": route.bundle_config_hash or None,
        # The collector reassembles result_chunk_v1 transfers (seed 001): a sidecar may chunk a large result.
        "accepts_result_chunks": True,
        "traceparent": ticket.trace.traceparent if ticket.trace is not None else None,
        "tracestate": ticket.trace.tracestate if ticket.trace is not None else None,
    }


def _fan_out(common: dict[str, Any], items: list[Item]) -> list[WorkItem]:
    request_id = common["request_id"]
    return [
        WorkItem(work_item_id=f"{request_id}.{index}", item_index=index, item=unstructure(item), **common)
        for index, item in enumerate(items)
    ]


def encode_work(route: Route, ticket: Ticket, request: EncodeRequest, output_types: list[str]) -> list[WorkItem]:
    """One encode item per input; `is_query` from `params.options.is_query`, `output_dtype` into options."""
    params = request.params
    options = dict(params.options or {}) if params is not None else {}
    if params is not None and params.output_dtype is not None:
        options["output_dtype"] = params.output_dtype
    common = _common(route, ticket, OPERATION_ENCODE, len(request.items))
    common.update(
        output_types=output_types,
        instruction=params.instruction if params is not None else None,
        is_query=options.get("is_query") is True,
        options=options or None,
    )
    return _fan_out(common, request.items)


def extract_work(route: Route, ticket: Ticket, request: ExtractRequest) -> list[WorkItem]:
    """One extract item per input, carrying `labels`, `output_schema`, `instruction` and `options`."""
    params = request.params
    common = _common(route, ticket, OPERATION_EXTRACT, len(request.items))
    if params is not None:
        common.update(
            labels=params.labels,
            output_schema=params.output_schema,
            instruction=params.instruction,
            options=params.options,
        )
    return _fan_out(common, request.items)


def score_work(route: Route, ticket: Ticket, request: ScoreRequest) -> list[WorkItem]:
    """One work item for the whole request: the query and every candidate travel together."""
    common = _common(route, ticket, OPERATION_SCORE, 1)
    item = WorkItem(
        work_item_id=f"{ticket.request_id}.0",
        item_index=0,
        query_item=unstructure(request.query),
        score_items=[unstructure(item) for item in request.items],
        instruction=request.instruction,
        options=request.options,
        **common,
    )
    return [item]


def token_work(
    route: Route, ticket: Ticket, operation: str, bodies: list[dict[str, Any]], options: dict[str, Any], is_query: bool
) -> list[WorkItem]:
    """One tokenize (`{"text"}`) or decode (`{"ids"}`) item per input; the sidecar answers them itself."""
    if operation not in (OPERATION_TOKENIZE, OPERATION_DECODE):
        raise ValueError(f"not a token operation: {operation!r}")
    common = _common(route, ticket, operation, len(bodies))
    common.update(options=options or None, is_query=is_query)
    request_id = common["request_id"]
    return [
        WorkItem(work_item_id=f"{request_id}.{index}", item_index=index, item=body, **common)
        for index, body in enumerate(bodies)
    ]


def generate_work(route: Route, ticket: Ticket, params: GenerateParams) -> WorkItem:
    """The one work item of a generation; its chunks stream back to the reply subject (sie.wire.generate)."""
    common = _common(route, ticket, OPERATION_GENERATE, 1)
    common["accepts_result_chunks"] = False  # chunks of a generation are GenerateChunks, never result_chunk_v1
    return WorkItem(work_item_id=f"{ticket.request_id}.0", item_index=0, generate=params, **common)
