"""Everything the sync and async clients share that needs no I/O: configuration, building calls, the retry state
of a call in progress, and translating httpx errors (httpx `BaseClient`, contracts Part A §2.5).

The two clients only send, await and sleep; nothing here touches the network or the clock's sleep.
"""

from __future__ import annotations

import errno
import random
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Generic, TypeVar

import attrs
import httpx

from sie.client._failures import read_error_response
from sie.client._generation import (
    EVENT_STREAM,
    GenerateParams,
    chunk_error,
    generate_body,
    generate_path,
    parse_generate,
    read_chunk,
    stream_failure,
)
from sie.client._images import with_wire_images
from sie.client._requests import (
    JSON,
    MODEL_REVISION_HEADER,
    MSGPACK,
    SDK_VERSION_HEADER,
    Call,
    CallKnobs,
    EncodeParams,
    ExtractParams,
    ScoreParams,
    as_item_list,
    encode_body,
    extract_body,
    lora_of,
    merge_options,
    routing_headers,
    score_body,
)
from sie.client._results import (
    attach_request_metadata,
    decode_body,
    parse_encode,
    parse_extract,
    parse_models,
    parse_score,
)
from sie.client._retry import (
    DEFAULT_PROVISION_TIMEOUT_S,
    Outcome,
    Random,
    RetryPolicy,
    RetryState,
    Stop,
    TransportFailure,
    TransportKind,
    attempt_cap,
    decide,
    terminal_error,
)
from sie.client.errors import RequestError, SIEError
from sie.wire import EncodeError, dumps_json, packb

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S = 10.0
# Longer than the gateway's default 120 s request deadline, so its typed 504 arrives before the client gives up.
DEFAULT_READ_TIMEOUT_S = 150.0

# Errnos worth retrying a connection for; anything else (TLS, EACCES, unknown host) fails fast.
_TRANSIENT_ERRNOS = frozenset(
    code
    for code in (
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        getattr(errno, "EHOSTDOWN", None),
        getattr(socket, "EAI_AGAIN", None),
    )
    if code is not None
)
_BROKEN = (httpx.WriteTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@attrs.frozen
class _Evidence:
    retry_count: int = 0
    model_revision: str | None = None


# Per thread (sync) or per task (async), keyed by client: concurrent calls never see each other's counts.
_EVIDENCE: ContextVar[Mapping[int, _Evidence] | None] = ContextVar("sie_client_evidence", default=None)


@cache
def sdk_version() -> str:
    """The version sent in X-SIE-SDK-Version: this package's."""
    try:
        return version("sie")
    except PackageNotFoundError:
        return "unknown"


def resolve_timeouts(
    timeout_s: float | None, connect_timeout_s: float | None, read_timeout_s: float | None
) -> tuple[float, float]:
    """(connect, read) seconds: `timeout_s` sets both, the specific ones win, defaults 10 s and 150 s."""
    connect = timeout_s if timeout_s is not None else DEFAULT_CONNECT_TIMEOUT_S
    read = timeout_s if timeout_s is not None else DEFAULT_READ_TIMEOUT_S
    return (
        connect_timeout_s if connect_timeout_s is not None else connect,
        read_timeout_s if read_timeout_s is not None else read,
    )


def _checked_base_url(base_url: str) -> str:
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
    return base_url.rstrip("/")


def transport_failure(exc: httpx.RequestError, base_url: str) -> TransportFailure:
    """Classify an httpx error for the retry ladder, with the message its stop error will carry."""
    timeout = isinstance(exc, httpx.TimeoutException)
    name = type(exc).__name__
    if isinstance(exc, httpx.ReadTimeout):
        message = (
            f"Request timed out waiting for the response ({name}). Not retried because the server may already "
            f"be processing the request; increase read_timeout_s for slow calls: {exc}"
        )
        return TransportFailure(kind=TransportKind.READ_TIMEOUT, message=message, timeout=True)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        kind = TransportKind.CONNECT if _is_transient(exc) else TransportKind.CONNECT_PERMANENT
        return TransportFailure(kind=kind, message=f"Failed to connect to {base_url}: {exc}", timeout=timeout)
    if isinstance(exc, _BROKEN):
        message = f"Request timed out: {exc}" if timeout else f"Connection lost mid-request ({name}): {exc}"
        return TransportFailure(kind=TransportKind.BROKEN, message=message, timeout=timeout)
    return TransportFailure(kind=TransportKind.OTHER, message=f"Request to {base_url} failed ({name}): {exc}")


def _is_transient(exc: BaseException) -> bool:
    # httpx wraps the OSError from the socket; walk the chain for an errno. With none (a bare test error,
    # a platform without errnos) the error counts as transient, as in sie-sdk.
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return False
        if isinstance(current, OSError) and current.errno is not None:
            return current.errno in _TRANSIENT_ERRNOS
        current = current.__cause__ or current.__context__
    return True


def _one_or_all(results: list[Any], single: bool) -> Any:
    return results[0] if single else results


class BaseClient:
    """Configuration and call building shared by SIEClient and SIEAsyncClient."""

    _http: httpx.Client | httpx.AsyncClient

    def __init__(  # noqa: PLR0913 - the sie-sdk 0.10.1 constructor keywords, plus the test seams
        self,
        base_url: str,
        *,
        timeout_s: float | None,
        connect_timeout_s: float | None,
        read_timeout_s: float | None,
        api_key: str | None,
        gpu: str | None,
        options: Mapping[str, Any] | None,
        clock: Callable[[], float] | None,
        rng: Random | None,
    ) -> None:
        self._base_url = _checked_base_url(base_url)
        self._connect_timeout, self._read_timeout = resolve_timeouts(timeout_s, connect_timeout_s, read_timeout_s)
        self._gpu = gpu
        self._options = None if options is None else dict(options)
        self._headers = {"Content-Type": MSGPACK, "Accept": MSGPACK, SDK_VERSION_HEADER: sdk_version()}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._clock = clock or time.monotonic
        self._rng: Random = rng or random.Random()

    def _http_options(self, max_connections: int | None) -> dict[str, Any]:
        options: dict[str, Any] = {
            "base_url": self._base_url,
            "headers": self._headers,
            "timeout": httpx.Timeout(self._read_timeout, connect=self._connect_timeout),
            "follow_redirects": False,
        }
        if max_connections is not None:
            options["limits"] = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        return options

    @property
    def base_url(self) -> str:
        """The server's base URL, without a trailing slash."""
        return self._base_url

    @property
    def last_retry_count(self) -> int:
        """How many retries the latest call in this thread (or task) made."""
        return self._evidence().retry_count

    @property
    def last_model_revision(self) -> str | None:
        """The X-SIE-Model-Revision of the latest successful call in this thread (or task), if it had one."""
        return self._evidence().model_revision

    def _evidence(self) -> _Evidence:
        return (_EVIDENCE.get() or {}).get(id(self), _Evidence())

    def _set_evidence(self, evidence: _Evidence) -> None:
        # A new map each time, so a task started from this context never shares counts with its parent.
        _EVIDENCE.set({**(_EVIDENCE.get() or {}), id(self): evidence})

    def _start(self, call: Call[T]) -> _CallRun[T]:
        self._set_evidence(_Evidence())
        return _CallRun(self, call)

    def _start_stream(self, call: Call[Any]) -> StreamRun:
        self._set_evidence(_Evidence())
        return StreamRun(self, call)

    def _encode_call(self, model: str, items: Any, params: EncodeParams, knobs: CallKnobs) -> Call[Any]:
        item_list, single = as_item_list(items)
        options = merge_options(self._options, params.options, is_query=params.is_query)

        def parse(data: dict[str, Any]) -> Any:
            return _one_or_all(parse_encode(data, model=model, submitted=len(item_list)), single)

        body = encode_body([with_wire_images(item) for item in item_list], params, options)
        return self._post("encode", model, body, options=options, knobs=knobs, parse=parse)

    def _score_call(self, model: str, query: Any, items: Any, params: ScoreParams, knobs: CallKnobs) -> Call[Any]:
        if isinstance(items, Mapping | str | bytes):
            raise TypeError(f"score() takes a list of items to rank, got {type(items).__name__}")
        options = merge_options(self._options, params.options)
        body = score_body(with_wire_images(query), [with_wire_images(item) for item in items], params, options)
        return self._post("score", model, body, options=options, knobs=knobs, parse=parse_score)

    def _extract_call(self, model: str, items: Any, params: ExtractParams, knobs: CallKnobs) -> Call[Any]:
        item_list, single = as_item_list(items)
        options = merge_options(self._options, params.options)

        def parse(data: dict[str, Any]) -> Any:
            return _one_or_all(parse_extract(data, model=model, submitted=len(item_list)), single)

        body = extract_body([with_wire_images(item) for item in item_list], params, options)
        return self._post("extract", model, body, options=options, knobs=knobs, parse=parse)

    def _post(
        self,
        what: str,
        model: str,
        body: dict[str, Any],
        *,
        options: Mapping[str, Any] | None,
        knobs: CallKnobs,
        parse: Callable[[dict[str, Any]], T],
    ) -> Call[T]:
        policy = self._policy(model, knobs, options)
        try:
            content = packb(body)
        except EncodeError as exc:
            raise TypeError(f"The {what} request cannot be serialized: {exc}") from exc
        # The model id goes into the path as it is: ids contain `/` and the server routes on `{model:path}`.
        path = f"/v1/{what}/{model}"
        headers = routing_headers(policy.gpu)
        return Call(
            method="POST",
            path=path,
            headers=headers,
            policy=policy,
            parse=parse,
            what=what,
            content=content,
            request_metadata=True,
        )

    def _generate_call(  # noqa: PLR0913 - one generate call's parts
        self,
        model: str,
        params: GenerateParams,
        options: Mapping[str, Any] | None,
        knobs: CallKnobs,
        *,
        stream: bool,
        read_timeout_s: float | None = None,
    ) -> Call[Any]:
        # JSON both ways (an event stream when streamed), as sie-sdk sends it. Not idempotent: a generation sent
        # twice may run twice, so the policy retries only what comes before the work is published.
        merged = merge_options(self._options, options)
        policy = self._policy(model, knobs, merged, idempotent=False)
        try:
            content = dumps_json(generate_body(params, merged, stream=stream))
        except EncodeError as exc:
            raise TypeError(f"The generate request cannot be serialized: {exc}") from exc
        headers = {"Content-Type": JSON, "Accept": EVENT_STREAM if stream else JSON, **routing_headers(policy.gpu)}
        return Call(
            method="POST",
            path=generate_path(model),
            headers=headers,
            policy=policy,
            parse=parse_generate,
            what="generate",
            content=content,
            read_timeout_s=read_timeout_s,
            request_metadata=True,
        )

    def _policy(
        self, model: str, knobs: CallKnobs, options: Mapping[str, Any] | None, *, idempotent: bool = True
    ) -> RetryPolicy:
        budget = knobs.provision_timeout_s
        return RetryPolicy(
            wait_for_capacity=knobs.wait_for_capacity,
            max_oom_retries=knobs.max_oom_retries,
            provision_timeout_s=DEFAULT_PROVISION_TIMEOUT_S if budget is None else budget,
            model=model,
            gpu=knobs.gpu if knobs.gpu is not None else self._gpu,
            lora=lora_of(options),
            idempotent=idempotent,
        )

    def _models_call(self, model: str | None) -> Call[Any]:
        # The catalogue reads are never retried (sie-sdk 0.10.1) and answer JSON.
        policy = RetryPolicy(model=model, retries_enabled=False)
        path, parse = ("/v1/models", parse_models) if model is None else (f"/v1/models/{model}", dict)
        return Call(method="GET", path=path, headers={"Accept": JSON}, policy=policy, parse=parse, what="models")


class _CallRun(Generic[T]):
    """One call in progress: the retry state between its attempts. The driver sends, awaits and sleeps."""

    def __init__(self, client: BaseClient, call: Call[T]) -> None:
        self._client = client
        self._call = call
        self._state = RetryState()
        self._started = client._clock()

    def _elapsed(self) -> float:
        return self._client._clock() - self._started

    def next_request(self) -> httpx.Request:
        """The next attempt's request, its timeouts capped by what is left of the budget."""
        cap = attempt_cap(self._state, elapsed=self._elapsed(), policy=self._call.policy)
        if isinstance(cap, Stop):
            raise cap.error
        self._state = attrs.evolve(self._state, after_capacity_wait=False)
        client, call = self._client, self._call
        read = call.read_timeout_s if call.read_timeout_s is not None else min(client._read_timeout, cap)
        timeout = httpx.Timeout(read, connect=min(client._connect_timeout, cap))
        return client._http.build_request(
            call.method, call.path, content=call.content, headers=call.headers, timeout=timeout
        )

    def failed(self, exc: httpx.RequestError) -> float:
        """The delay before the next attempt after `exc`, or raise the error the ladder stops with."""
        return self._decide(transport_failure(exc, self._client.base_url), exc)

    def answered(self, response: httpx.Response) -> float | None:
        """None when `response` is the answer; else the delay before the next attempt, or raise."""
        if response.status_code < 400:
            return None
        return self._decide(read_error_response(response.status_code, response.headers, response.content), None)

    def _decide(self, outcome: Outcome, cause: BaseException | None) -> float:
        policy, rng = self._call.policy, self._client._rng
        decision = decide(outcome, self._state, elapsed=self._elapsed(), policy=policy, rng=rng)
        if isinstance(decision, Stop):
            raise decision.error from cause
        self._state = decision.state
        self._client._set_evidence(_Evidence(retry_count=decision.state.retries))
        return decision.delay

    def finish(self, response: httpx.Response) -> T:
        """Parse the answer (each result stamped with the request's metadata) and note its model revision."""
        revision = response.headers.get(MODEL_REVISION_HEADER) or None
        self._client._set_evidence(_Evidence(self._state.retries, revision))
        data = decode_body(response.status_code, response.headers, response.content, what=self._call.what)
        result = self._call.parse(data)
        if self._call.request_metadata:
            attach_request_metadata(result, response.headers)
        return result


@attrs.frozen
class Again:
    """An error event before any chunk was yielded: attempt the stream again after `delay` seconds."""

    delay: float


class StreamRun(_CallRun[Any]):
    """One streamed call in progress: retried like any call until its first chunk, then every failure is final.

    The driver reads the answer's lines; this decides what each status, event and broken connection means.
    """

    def __init__(self, client: BaseClient, call: Call[Any]) -> None:
        super().__init__(client, call)
        self._yielded = False

    def refused(self, response: httpx.Response) -> float:
        """The delay before the next attempt after a non-200 answer (its body read), or raise."""
        if response.status_code < 400:
            raise RequestError(
                f"Unexpected {self._call.what} HTTP response (status={response.status_code})",
                status_code=response.status_code,
            )
        return self._decide(read_error_response(response.status_code, response.headers, response.content), None)

    def opened(self, response: httpx.Response) -> None:
        """The stream is open: note its retries and model revision."""
        revision = response.headers.get(MODEL_REVISION_HEADER) or None
        self._client._set_evidence(_Evidence(self._state.retries, revision))

    def chunk(self, payload: str) -> dict[str, Any] | Again:
        """The chunk one event carries; an error event raises, or, before any chunk was yielded, may retry."""
        chunk = read_chunk(payload)
        error = chunk_error(chunk)
        if error is None:
            self._yielded = True
            return chunk
        if self._yielded:
            raise stream_failure(error)
        return Again(self._decide(error, None))

    def broken(self, exc: httpx.RequestError) -> SIEError:
        """The error to raise when the connection fails while the answer is read: the generation may be running."""
        return terminal_error(transport_failure(exc, self._client.base_url), self._call.policy)
