"""Text generation over the work queue: the three request shapes (SIE-native `/v1/generate/{model}`, OpenAI chat and
completions) parsed into one GenerateCall, and the domain call that routes it, publishes its one work item and
hands back the ordered chunks (seed 000 §2; seed 001, Generation). When the gateway stops reading before the
last chunk (client gone, timeout, failure) it announces `cancel.{router_id}.{request_id}` so the worker stops.
No web framework, no status codes: refusals are the typed exceptions in errors.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from sie.catalog.errors import ModelNotFoundError
from sie.catalog.model import Tasks
from sie.catalog.names import generate_cancel_subject
from sie.gateway import workitems
from sie.gateway.collector import ChunkStream, Collector
from sie.gateway.errors import GatewayError, GenerationFailedError, InvalidRequestError, WorkerRetryableError
from sie.gateway.limits import RequestLimits
from sie.gateway.pools import PoolDirectory
from sie.gateway.publisher import WorkPublisher
from sie.gateway.router import LaneHints, Route, Router
from sie.gateway.service import admit, fail_unless_stored, route_request
from sie.gateway.workitems import Ticket
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import TraceHeaders
from sie.transport.base import MessageBus
from sie.wire import codes
from sie.wire.generate import FINISH_ERROR, GenerateChunk
from sie.wire.queue import GenerateParams

logger = logging.getLogger(__name__)

MAX_STOP_STRINGS: Final = 4  # as the worker's StopChecker allows
CHAT_ROLES: Final = frozenset({"system", "user", "assistant", "developer"})
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16  # OpenAI's default for /v1/completions
_INT64: Final = 2**63
# Seed 000 §2: a RESOURCE_EXHAUSTED terminal chunk's retry hint is honoured only as an integer in 1..60.
_RETRY_AFTER_RANGE: Final = range(1, 61)
_INPUT_ERROR_CODES: Final = frozenset({codes.INVALID_INPUT, codes.INPUT_TOO_LONG})
# Cancels announced but not yet sent; past this many a cancel is skipped (max_tokens still bounds the generation).
MAX_PENDING_CANCELS: Final = 1024

# --- requests -------------------------------------------------------------------------------------------------


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


# Fields a surface accepts and ignores (routing hints of hosted deployments, end-user ids, OpenAI bookkeeping).
_IGNORED_NATIVE: Final = frozenset({"routing_key", "prompt_cache_key", "safety_identifier"})
_IGNORED_OPENAI: Final = frozenset(
    {"user", "safety_identifier", "prompt_cache_key", "routing_key", "metadata", "store", "service_tier",
     "parallel_tool_calls"}
)  # fmt: skip


# The values of fields SIE does not serve that ask for nothing (OpenAI's defaults); an empty list or map, and
# None, ask for nothing either.
_NEUTRAL: Final[dict[str, tuple[Any, ...]]] = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "repetition_penalty": (1,), "n": (1,), "best_of": (1,),
    "logprobs": (False, 0), "top_logprobs": (0,), "echo": (False,), "include_reasoning": (False,),
    "tool_choice": ("none", "auto"), "function_call": ("none", "auto"), "modalities": (["text"],),
    "response_format": ({"type": "text"},),
}  # fmt: skip


def _unsupported(name: str, value: Any) -> bool:
    """Whether a field SIE does not serve asks for something (grammar, lora_adapter, suffix: any value does)."""
    if value is None or (type(value) in (list, dict) and not value):
        return False
    return value not in _NEUTRAL.get(name, ())


_UNSUPPORTED_NATIVE: Final = frozenset(
    {"images", "grammar", "logit_bias", "lora_adapter", "logprobs", "top_logprobs", "frequency_penalty",
     "presence_penalty"}
)  # fmt: skip
_UNSUPPORTED_CHAT: Final = frozenset(
    {"tools", "tool_choice", "functions", "function_call", "response_format", "logprobs",
     "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty", "best_of",
     "lora_adapter", "audio", "modalities", "prediction", "include_reasoning"}
)  # fmt: skip
_UNSUPPORTED_COMPLETIONS: Final = frozenset(
    {"echo", "suffix", "best_of", "logprobs", "logit_bias", "frequency_penalty", "presence_penalty", "lora_adapter"}
)
_SAMPLING: Final = frozenset({"temperature", "top_p", "top_k", "stop", "seed", "stream"})
_NATIVE_FIELDS: Final = _SAMPLING | {"prompt", "max_new_tokens", "options"}
_CHAT_FIELDS: Final = _SAMPLING | {"model", "messages", "max_tokens", "max_completion_tokens", "n", "stream_options"}
_COMPLETIONS_FIELDS: Final = _SAMPLING | {"model", "prompt", "max_tokens", "n", "stream_options"}


def _check_fields(
    data: dict[str, Any], known: frozenset[str], ignored: frozenset[str], refused: frozenset[str]
) -> None:
    for name, value in data.items():
        if name in known or name in ignored:
            continue
        if name in refused:
            if _unsupported(name, value):
                raise InvalidRequestError(f"Field '{name}' is not supported by this server", param=name)
            continue
        raise InvalidRequestError(f"Unknown field '{name}'", param=name)


def _object(data: Any) -> dict[str, Any]:
    if type(data) is not dict:
        raise InvalidRequestError("Request body must be a JSON object")
    return data


def _int(data: dict[str, Any], name: str, minimum: int, default: int | None = None) -> int | None:
    value = data.get(name)
    if value is None:
        return default
    if type(value) is not int or value < minimum:
        raise InvalidRequestError(f"Field '{name}' must be an integer >= {minimum}, got {value!r}", param=name)
    return value


def _number(data: dict[str, Any], name: str) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise InvalidRequestError(f"Field '{name}' must be a number, got {value!r}", param=name)
    return float(value)


def _sampling(data: dict[str, Any], max_tokens: int | None, **prompt: Any) -> GenerateParams:
    """The sampling fields every surface shares, checked as the worker would check them (SamplingParams)."""
    temperature, top_p = _number(data, "temperature"), _number(data, "top_p")
    if temperature is not None and temperature < 0:
        raise InvalidRequestError(f"Field 'temperature' must be >= 0, got {temperature!r}", param="temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise InvalidRequestError(f"Field 'top_p' must be in (0, 1], got {top_p!r}", param="top_p")
    seed = data.get("seed")
    if seed is not None and (type(seed) is not int or not -_INT64 <= seed < _INT64):
        raise InvalidRequestError(f"Field 'seed' must be a 64-bit integer, got {seed!r}", param="seed")
    return GenerateParams(
        max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=_int(data, "top_k", 0),
        seed=seed, stop=_stop(data.get("stop")), **prompt,
    )  # fmt: skip


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if type(value) is str else value
    if type(stops) is not list or not all(type(stop) is str and stop for stop in stops):
        raise InvalidRequestError("Field 'stop' must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"Field 'stop' holds at most {MAX_STOP_STRINGS} strings", param="stop")
    return stops or None


def _stream(data: dict[str, Any]) -> bool:
    value = data.get("stream")
    if value is not None and type(value) is not bool:
        raise InvalidRequestError("Field 'stream' must be a boolean", param="stream")
    return value is True


def _include_usage(data: dict[str, Any]) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if type(options) is not dict:
        raise InvalidRequestError("Field 'stream_options' must be an object", param="stream_options")
    return options.get("include_usage") is True


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if type(model) is not str or not model:
        raise InvalidRequestError("Field 'model' is required and must be a string", param="model")
    return model


def parse_native(model: str, data: Any) -> GenerateCall:
    """`POST /v1/generate/{model}`: `{prompt, max_new_tokens, temperature?, top_p?, top_k?, stop?, seed?, stream?,
    options?}`; each refusal names its field."""
    data = _object(data)
    _check_fields(data, _NATIVE_FIELDS, _IGNORED_NATIVE, _UNSUPPORTED_NATIVE)
    prompt = data.get("prompt")
    if type(prompt) is not str:
        raise InvalidRequestError("Field 'prompt' is required and must be a string", param="prompt")
    if data.get("max_new_tokens") is None:
        raise InvalidRequestError("Field 'max_new_tokens' is required", param="max_new_tokens")
    options = data.get("options")
    if options is not None and type(options) is not dict:
        raise InvalidRequestError("Field 'options' must be an object", param="options")
    profile = options.get("profile") if options else None
    params = _sampling(data, _int(data, "max_new_tokens", 1), prompt=prompt)
    return GenerateCall(model, params, _stream(data), profile=profile)


def parse_chat(data: Any) -> GenerateCall:
    """`POST /v1/chat/completions` (the text subset of OpenAI's): messages rendered with the model's chat template."""
    data = _object(data)
    _check_fields(data, _CHAT_FIELDS, _IGNORED_OPENAI, _UNSUPPORTED_CHAT)
    model = _model(data)
    _int(data, "n", 1)
    if data.get("n") not in (None, 1):
        raise InvalidRequestError("Only n=1 is supported", param="n")
    field = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    params = _sampling(data, _int(data, field, 1), messages=_messages(data.get("messages")))
    return GenerateCall(model, params, _stream(data), _include_usage(data), max_tokens_field=field)


def _messages(value: Any) -> list[dict[str, Any]]:
    if type(value) is not list or not value:
        raise InvalidRequestError("Field 'messages' must be a non-empty list", param="messages")
    return [_message(index, message) for index, message in enumerate(value)]


def _message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if type(message) is not dict:
        raise InvalidRequestError(f"Field '{where}' must be an object with 'role' and 'content'", param=where)
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise InvalidRequestError(
            f"Field '{where}.role' must be one of {sorted(CHAT_ROLES)}, got {role!r}", param=f"{where}.role"
        )
    content = message.get("content")
    if type(content) is list:  # content parts: only text ones
        if not all(type(part) is dict and part.get("type") == "text" and type(part.get("text")) is str
                   for part in content):  # fmt: skip
            raise InvalidRequestError(f"Field '{where}.content' may hold text parts only", param=f"{where}.content")
        content = "".join(part["text"] for part in content)
    if type(content) is not str:
        raise InvalidRequestError(f"Field '{where}.content' must be a string", param=f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def parse_completion(data: Any) -> GenerateCall:
    """`POST /v1/completions`: one raw prompt continued (`max_tokens` defaults to 16, as OpenAI's)."""
    data = _object(data)
    _check_fields(data, _COMPLETIONS_FIELDS, _IGNORED_OPENAI, _UNSUPPORTED_COMPLETIONS)
    model = _model(data)
    if data.get("n") not in (None, 1):
        raise InvalidRequestError("Only n=1 is supported", param="n")
    prompt = data.get("prompt")
    if type(prompt) is list and len(prompt) == 1:
        prompt = prompt[0]
    if type(prompt) is not str:
        raise InvalidRequestError("Field 'prompt' must be a string or a list of exactly one string", param="prompt")
    max_tokens = _int(data, "max_tokens", 1, COMPLETIONS_DEFAULT_MAX_TOKENS)
    params = _sampling(data, max_tokens, prompt=prompt)
    return GenerateCall(model, params, _stream(data), _include_usage(data), max_tokens_field="max_tokens")


# --- chunks to errors -----------------------------------------------------------------------------------------


def chunk_error(chunk: GenerateChunk) -> GatewayError | None:
    """The failure a terminal chunk reports, or None for a chunk that is not one."""
    if chunk.error_code is None and chunk.finish_reason != FINISH_ERROR:
        return None
    code = chunk.error_code or codes.INFERENCE_ERROR
    message = chunk.error or f"Generation failed ({code})"
    if code in _INPUT_ERROR_CODES:
        return InvalidRequestError(message, code=code)
    if code in codes.RETRYABLE_WORKER_CODES:
        hint = chunk.retry_after_s
        valid = code == codes.RESOURCE_EXHAUSTED and type(hint) is int and hint in _RETRY_AFTER_RANGE
        return WorkerRetryableError(message, code=code, retry_after_s=hint if valid else None)
    return GenerationFailedError(message, code=code)


# --- the domain call ------------------------------------------------------------------------------------------


class Generation:
    """One published generation: `next()` gives its chunks in order (raising the failure a chunk reports) until
    the done chunk; `close()` must follow, and announces the cancel when the worker may still be decoding."""

    def __init__(  # noqa: PLR0913 - what one running generation holds
        self,
        route: Route,
        request_id: str,
        stream: ChunkStream,
        timeout_s: float,
        on_abandon: Callable[[str], None],
        exits: contextlib.ExitStack,
    ) -> None:
        self.route = route
        self.request_id = request_id
        self.publish_ms = 0.0
        self._stream = stream
        self._timeout_s = timeout_s
        self._on_abandon = on_abandon
        self._exits = exits  # what the generation holds while it runs (its lane's in-flight count)
        self._closed = False

    @property
    def attempt_id(self) -> str | None:
        return self._stream.attempt_id

    async def next(self) -> GenerateChunk:
        """The next chunk; GatewayTimeoutError when none comes within the request timeout, the failure a worker
        error chunk reports, or the failure that ended the stream."""
        chunk = await self._stream.next(self._timeout_s)
        error = chunk_error(chunk)
        if error is not None:
            raise error
        return chunk

    def close(self) -> None:
        """Stop reading; if the done chunk never came, tell the worker to stop (best effort). Idempotent."""
        if self._closed:
            return
        self._closed = True
        finished = self._stream.finished
        self._stream.close()
        self._exits.close()
        if not finished:
            self._on_abandon(self.request_id)


class GenerationService:
    """Generate over the work queue: route as encode does (pools, X-SIE-Pool, machine profiles, PROVISIONING),
    publish one work item, read its chunks from the collector."""

    def __init__(  # noqa: PLR0913 - the collaborators of the generation path
        self,
        router: Router,
        publisher: WorkPublisher,
        collector: Collector,
        bus: MessageBus,
        timeout_s: float,
        pools: PoolDirectory,
        limits: RequestLimits | None = None,
    ) -> None:
        self._router = router
        self._limits = limits or RequestLimits()
        self._publisher = publisher
        self._collector = collector
        self._bus = bus
        self._timeout_s = timeout_s
        self._pools = pools
        self._cancels: set[asyncio.Task[None]] = set()

    async def start(self, call: GenerateCall, hints: LaneHints, trace: TraceHeaders | None = None) -> Generation:
        """Route, admit and publish `call`; the caller reads the returned Generation and closes it."""
        note_request(model=call.model, items=1)
        self._limits.check_prompt(call.prompt_chars)
        route = await self._route(call.model, call.profile, hints)
        if route.config is not None:
            _check_model(call, route.model, route.config.tasks)
        request_id, reply = self._publisher.new_request()
        note_request(request_id=request_id)
        now = time.time()
        ticket = Ticket(request_id, reply, self._publisher.router_id, now, now + self._timeout_s, trace)
        item = workitems.generate_work(route, ticket, call.params)
        direct = await admit(self._publisher, self._pools, route, request_id, 1)
        stream = self._collector.open_stream(request_id)
        exits = contextlib.ExitStack()
        generation = Generation(route, request_id, stream, self._timeout_s, self.abandon, exits)
        started = time.perf_counter()
        try:
            exits.enter_context(self._publisher.in_flight(route.lane, 1))
            stored = await self._publisher.publish(route.lane, route.subject, [item], direct)
            stored.add_done_callback(functools.partial(fail_unless_stored, stream.fail, route.subject))
        except BaseException:
            generation.close()
            raise
        generation.publish_ms = (time.perf_counter() - started) * 1e3
        return generation

    async def _route(self, spec: str, profile: Any, hints: LaneHints) -> Route:
        """The request's route; `org__name` is read as `org/name`, as the SDK writes model ids into the native
        path."""
        try:
            return await route_request(self._router, self._pools, spec, profile, hints)
        except ModelNotFoundError:
            if "__" not in spec:
                raise
            return await route_request(self._router, self._pools, spec.replace("__", "/"), profile, hints)

    def abandon(self, request_id: str) -> None:
        """Announce `cancel.{router_id}.{request_id}` (NATS core, best effort, detached): the sidecar forwards it to
        the worker decoding the request."""
        if len(self._cancels) >= MAX_PENDING_CANCELS:
            logger.debug("cancel of generation %s skipped: %d pending", request_id, len(self._cancels))
            return
        task = asyncio.get_running_loop().create_task(self._announce(request_id))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _announce(self, request_id: str) -> None:
        router_id = self._publisher.router_id
        try:
            await self._bus.publish(generate_cancel_subject(router_id, request_id),
                                    {"router_id": router_id, "request_id": request_id})  # fmt: skip
        except Exception:  # noqa: BLE001 - best effort: max_tokens still bounds the generation
            logger.debug("announcing the cancel of generation %s failed", request_id, exc_info=True)


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
