"""Text generation over the dispatch core (seed 000 §2; seed 001, Generation): one GenerateCall, whichever surface
it came in on (SIE-native `/v1/generate/{model}`, OpenAI chat and completions: their parsers are in the HTTP
surface), is checked against the routed model and published as one work item whose chunks the caller reads from
the returned stream. When the caller stops reading before the last chunk (client gone, timeout, failure), closing
the stream announces `cancel.{router_id}.{request_id}` so the worker stops.
No web framework, no status codes: refusals are the typed exceptions in errors.py.
"""

from __future__ import annotations

from typing import Any

import attrs

from sie.catalog.errors import ModelNotFoundError
from sie.catalog.model import Tasks
from sie.gateway import workitems
from sie.gateway.dispatch import Dispatcher, Streamed
from sie.gateway.errors import InvalidRequestError
from sie.gateway.limits import RequestLimits
from sie.gateway.router import LaneHints, Route
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import TraceHeaders
from sie.wire.queue import GenerateParams


@attrs.frozen
class GenerateCall:
    """One parsed generation request, whichever surface it came in on."""

    model: str
    params: GenerateParams
    stream: bool = False
    include_usage: bool = False  # OpenAI `stream_options.include_usage`: a last chunk with the usage
    profile: str | None = None  # native `options.profile`
    max_tokens_field: str = "max_new_tokens"  # the field the caller set the output limit with, for refusals

    @property
    def prompt_chars(self) -> int:
        """Characters of the prompt, or of every chat message's text together."""
        if self.params.prompt is not None:
            return len(self.params.prompt)
        return sum(len(str(message.get("content") or "")) for message in self.params.messages or ())


class GenerationService:
    """Generate over the dispatch core: route as encode does (pools, X-SIE-Pool, machine profiles, PROVISIONING),
    publish one work item, hand back its chunk stream."""

    def __init__(self, dispatcher: Dispatcher, limits: RequestLimits | None = None) -> None:
        self._dispatcher = dispatcher
        self._limits = limits or RequestLimits()

    async def start(self, call: GenerateCall, hints: LaneHints, trace: TraceHeaders | None = None) -> Streamed:
        """Route, admit and publish `call`; the caller reads the returned stream and closes it."""
        note_request(model=call.model, items=1)
        self._limits.check_prompt(call.prompt_chars)
        route = await self._route(call.model, call.profile, hints)
        if route.config is not None:
            _check_model(call, route.model, route.config.tasks)
        return await self._dispatcher.stream(
            route, lambda ticket: workitems.generate_work(route, ticket, call.params), trace
        )

    async def _route(self, spec: str, profile: Any, hints: LaneHints) -> Route:
        """The request's route; `org__name` is read as `org/name`, as the SDK writes model ids into the native
        path."""
        try:
            return await self._dispatcher.route(spec, profile, hints)
        except ModelNotFoundError:
            if "__" not in spec:
                raise
            return await self._dispatcher.route(spec.replace("__", "/"), profile, hints)


def _check_model(call: GenerateCall, model: str, tasks: Tasks) -> None:
    """Refuse, before anything is queued, what the routed model cannot do: generate at all, or that many tokens."""
    if not tasks.generate:
        raise InvalidRequestError(f"Model '{model}' does not support generation", param="model")
    asked, most = call.params.max_new_tokens, tasks.max_output_tokens
    if asked is not None and most is not None and asked > most:
        field = call.max_tokens_field
        raise InvalidRequestError(
            f"Field '{field}' must be at most {most} for model '{model}' (its max_output_tokens), got {asked}",
            param=field,
        )
