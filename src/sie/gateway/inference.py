"""Encode, score and extract (seed 000 §2, §16.2): each checks its request against the limits and the routed model,
builds its work items and answers from the results the dispatch core collects. One method per operation; each is
the single domain call a handler makes (the compatibility dialects call `encode_results` / `score_results` and shape
the answer themselves). No web framework, no status codes: failures are the typed exceptions in errors.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import attrs

from sie.gateway import assembly, router, workitems
from sie.gateway.dispatch import Collected, Dispatcher
from sie.gateway.limits import RequestLimits
from sie.gateway.metadata import ResponseMetadata
from sie.gateway.router import LaneHints, Route
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import TraceHeaders
from sie.wire.http import EncodeParams, EncodeRequest, ExtractParams, ExtractRequest, Item, ScoreRequest
from sie.wire.queue import (
    OPERATION_DECODE,
    OPERATION_ENCODE,
    OPERATION_EXTRACT,
    OPERATION_SCORE,
    OPERATION_TOKENIZE,
)


@attrs.frozen
class Served:
    """A successful answer: the body to render and the timings for its headers."""

    body: Any  # a JSON-ready object (a bare list for the dialects that answer one)
    meta: ResponseMetadata


def _profile(options: dict[str, Any] | None) -> Any:
    return options.get("profile") if options else None


def _instruction(params: EncodeParams | ExtractParams | None) -> str | None:
    return params.instruction if params is not None else None


class InferenceService:
    """Encode, score and extract over the dispatch core."""

    def __init__(self, dispatcher: Dispatcher, limits: RequestLimits | None = None) -> None:
        self._dispatcher = dispatcher
        self._limits = limits or RequestLimits()

    async def encode(
        self, spec: str, request: EncodeRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        collected = await self.encode_results(spec, request, hints, trace)
        failed = assembly.check_failures(collected.results)
        body = assembly.encode_body(collected.route.model, request.items, collected.results, failed)
        return Served(body, collected.meta)

    async def encode_results(
        self,
        spec: str,
        request: EncodeRequest,
        hints: LaneHints,
        trace: TraceHeaders | None = None,
        check: Callable[[Route], None] | None = None,
    ) -> Collected:
        """The raw results of an encode (a compatibility dialect reshapes them itself); `check` refuses, before any
        work is published, what the routed model cannot do."""
        note_request(model=spec, items=len(request.items))
        self._limits.check(request.items)
        await self._check_images(request.items)
        params = request.params
        route = await self._dispatcher.route(spec, _profile(params.options if params else None), hints)
        router.check_inputs(route, request.items)
        outputs = router.encode_outputs(
            route, params.output_types if params else None, params.options if params else None
        )
        router.check_output_dtype(params)
        router.check_options(route, params.options if params else None, OPERATION_ENCODE, _instruction(params))
        if check is not None:
            check(route)
        return await self._dispatcher.collect(
            route, lambda ticket: workitems.encode_work(route, ticket, request, outputs), trace
        )

    async def _check_images(self, items: list[Item], query: Item | None = None) -> None:
        """The items' images against the image limits, probed in a thread (many headers take a while); nothing to do
        for a request without images."""
        if any(item.images for item in items) or (query is not None and query.images):
            await asyncio.to_thread(self._limits.check_images, items, query)

    async def score(
        self, spec: str, request: ScoreRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        collected = await self.score_results(spec, request, hints, trace)
        body = assembly.score_body(collected.route.model, request.query.id, collected.results[0])
        return Served(body, collected.meta)

    async def score_results(
        self, spec: str, request: ScoreRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Collected:
        """The one result of a score (a compatibility dialect reshapes it itself), its failure already raised."""
        note_request(model=spec, items=len(request.items))
        self._limits.check(request.items, request.query)
        await self._check_images(request.items, request.query)
        route = await self._dispatcher.route(spec, _profile(request.options), hints)
        router.check_score(route)
        router.check_inputs(route, [request.query, *request.items])
        router.check_options(route, request.options, OPERATION_SCORE, request.instruction)
        collected = await self._dispatcher.collect(
            route, lambda ticket: workitems.score_work(route, ticket, request), trace
        )
        assembly.check_failures(collected.results, per_item=False)
        return collected

    async def tokenize(
        self,
        spec: str,
        texts: list[str],
        options: dict[str, Any],
        hints: LaneHints,
        trace: TraceHeaders | None = None,
        *,
        is_query: bool = False,
    ) -> Served:
        """Each text's tokens as the routed model reads them (`TextTokenizer.tokens`), answered by its sidecar: a
        list of token lists."""
        self._limits.check([Item(text=text) for text in texts])
        bodies = [{"text": text} for text in texts]
        collected = await self._tokens(spec, OPERATION_TOKENIZE, bodies, options, hints, trace, is_query)
        return Served([assembly.decode_result(result)["tokens"] for result in collected.results], collected.meta)

    async def decode(
        self,
        spec: str,
        sequences: list[list[int]],
        options: dict[str, Any],
        hints: LaneHints,
        trace: TraceHeaders | None = None,
    ) -> Served:
        """The text of each token-id sequence, with the routed model's tokenizer: a list of strings."""
        self._limits.check([Item() for _ in sequences])
        bodies = [{"ids": ids} for ids in sequences]
        collected = await self._tokens(spec, OPERATION_DECODE, bodies, options, hints, trace, False)
        return Served([assembly.decode_result(result)["text"] for result in collected.results], collected.meta)

    async def _tokens(  # noqa: PLR0913 - one token operation's request
        self,
        spec: str,
        operation: str,
        bodies: list[dict[str, Any]],
        options: dict[str, Any],
        hints: LaneHints,
        trace: TraceHeaders | None,
        is_query: bool,
    ) -> Collected:
        note_request(model=spec, items=len(bodies))
        route = await self._dispatcher.route(spec, None, hints)
        collected = await self._dispatcher.collect(
            route, lambda ticket: workitems.token_work(route, ticket, operation, bodies, options, is_query), trace
        )
        assembly.check_failures(collected.results, strict=True)
        return collected

    async def extract(
        self, spec: str, request: ExtractRequest, hints: LaneHints, trace: TraceHeaders | None = None
    ) -> Served:
        note_request(model=spec, items=len(request.items))
        self._limits.check(request.items)
        await self._check_images(request.items)
        params = request.params
        route = await self._dispatcher.route(spec, _profile(params.options if params else None), hints)
        router.check_inputs(route, request.items)
        # Options first: a union model's `default_labels` option stands in for the labels checked next.
        router.check_options(route, params.options if params else None, OPERATION_EXTRACT, _instruction(params))
        router.check_extract(route, params, self._limits.max_labels, request.items)
        collected = await self._dispatcher.collect(
            route, lambda ticket: workitems.extract_work(route, ticket, request), trace
        )
        failed = assembly.check_failures(collected.results)
        body = assembly.extract_body(route.model, request.items, collected.results, failed)
        return Served(body, collected.meta)
