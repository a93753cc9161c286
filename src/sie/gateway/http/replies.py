"""The one mapping from exceptions to the gateway's HTTP error answers: status, envelope and headers per surface.

SIE-native answers use `{"detail": {...}}` for 4xx, the SDK retry envelope `{"error": {"code", "message"}}`
for 503/504/502, and `{"error": "all_items_failed", "details": [...]}` for mixed failures (seed 000 §2);
the OpenAI surface uses the OpenAI envelope for every status. Rules are looked up along the exception's MRO.
Pure: builds plain data, imports no web framework.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import attrs

from sie.catalog.errors import BundleConflictError, ModelNotFoundError
from sie.gateway.errors import (
    AllItemsFailedError,
    ClientDisconnectedError,
    ForbiddenError,
    GatewayError,
    GatewayTimeoutError,
    GenerationFailedError,
    InvalidRequestError,
    MachineProfileNotConfiguredError,
    ModelLoadFailedError,
    NotFoundError,
    PayloadTooLargeError,
    RetryableError,
    TransportFailureError,
    UnauthorizedError,
)
from sie.gateway.http.headers import ERROR_CODE, RETRY_AFTER, VERSION_HEADERS
from sie.http.errors import BodyIncompleteError, BodyTooLargeError
from sie.pools import (
    InvalidPoolError,
    PoolConflictError,
    PoolError,
    PoolExistsError,
    PoolNotFoundError,
    PoolProtectedError,
)
from sie.wire import DecodeError, codes, dumps_json
from sie.wire.envelopes import all_items_failed_body, detail_body, openai_body, retry_body, status_body

logger = logging.getLogger(__name__)

OPENAI_PATHS: Final = frozenset({"/v1/embeddings", "/v1/chat/completions", "/v1/completions", "/v1/responses"})
# Seed 000 §2: SIE-native generation answers errors in the OpenAI envelope too.
OPENAI_PREFIXES: Final = ("/v1/generate/",)
OPENAI_SERVER_ERROR: Final = "server_error"
# RFC 6750: a 401 names the scheme the caller should authenticate with.
WWW_AUTHENTICATE: Final = "WWW-Authenticate"
BEARER_CHALLENGE: Final = "Bearer"
INTERNAL_MESSAGE: Final = "Internal server error"


class Surface(enum.Enum):
    """Which error envelope family a route answers with."""

    NATIVE = "native"
    OPENAI = "openai"
    TEI = "tei"  # {"error", "error_type"}, validation failures as 422
    COHERE = "cohere"  # {"message"}: Cohere's and Jina's rerank/embed
    OLLAMA = "ollama"  # {"error"}
    KSERVE = "kserve"  # {"error"}: the Open Inference Protocol's


# The dialect routes, for errors answered before a route is matched (authentication, body limits).
COHERE_PATHS: Final = frozenset({"/v1/rerank", "/v2/rerank", "/v2/embed"})
OLLAMA_PATHS: Final = frozenset({"/api/embed", "/api/embeddings"})
TEI_SUFFIXES: Final = ("/embed", "/embed_sparse", "/embed_all", "/rerank", "/predict", "/tokenize", "/decode")
# TEI's OpenAI routes under a model's base URL (/{model}/v1/embeddings, /{model}/embeddings) answer in OpenAI's
# envelope (Ollama's /api/embeddings is matched before them).
TEI_OPENAI_SUFFIX: Final = "/embeddings"


class Envelope(enum.Enum):
    """The native envelope a rule selects."""

    DETAIL = "detail"
    RETRY = "retry"
    ITEMS = "items"
    STATUS = "status"


@attrs.frozen
class Rule:
    """How one exception class answers: its status and its native envelope."""

    status: int
    envelope: Envelope


@attrs.frozen
class ErrorReply:
    """A rendered-to-data error answer: status, JSON-ready body and headers."""

    status: int
    body: Any
    headers: dict[str, str]

    def content(self) -> bytes:
        return dumps_json(self.body)


RULES: Final[dict[type[BaseException], Rule]] = {
    DecodeError: Rule(400, Envelope.DETAIL),
    InvalidRequestError: Rule(400, Envelope.DETAIL),
    UnauthorizedError: Rule(401, Envelope.DETAIL),
    ForbiddenError: Rule(403, Envelope.DETAIL),
    ModelNotFoundError: Rule(404, Envelope.DETAIL),
    NotFoundError: Rule(404, Envelope.DETAIL),
    BundleConflictError: Rule(409, Envelope.DETAIL),
    InvalidPoolError: Rule(400, Envelope.DETAIL),
    PoolProtectedError: Rule(403, Envelope.DETAIL),
    PoolNotFoundError: Rule(404, Envelope.DETAIL),
    PoolExistsError: Rule(409, Envelope.DETAIL),
    PoolConflictError: Rule(409, Envelope.DETAIL),
    PayloadTooLargeError: Rule(413, Envelope.DETAIL),
    BodyTooLargeError: Rule(413, Envelope.DETAIL),
    # nginx's "client closed request": recorded in access logs, never read by the caller.
    ClientDisconnectedError: Rule(499, Envelope.DETAIL),
    BodyIncompleteError: Rule(499, Envelope.DETAIL),
    AllItemsFailedError: Rule(500, Envelope.ITEMS),
    GenerationFailedError: Rule(500, Envelope.DETAIL),
    ModelLoadFailedError: Rule(502, Envelope.RETRY),
    MachineProfileNotConfiguredError: Rule(503, Envelope.STATUS),
    RetryableError: Rule(503, Envelope.RETRY),
    # Not a RetryableError: the retry envelope without Retry-After, so the SDK does not retry it (seed 000 §16.2).
    TransportFailureError: Rule(503, Envelope.RETRY),
    GatewayTimeoutError: Rule(504, Envelope.RETRY),
}
_INTERNAL: Final = Rule(500, Envelope.DETAIL)

# OpenAI `error.code` for the client errors OpenAI clients know; server errors keep the SIE code.
_OPENAI_CODES: Final = {
    400: codes.OPENAI_INVALID_REQUEST,
    401: "invalid_api_key",
    404: codes.OPENAI_MODEL_NOT_FOUND,
    413: "payload_too_large",
}
_OPENAI_PARAMS: Final[dict[type[BaseException], str]] = {ModelNotFoundError: "model"}


def rule_for(exc: BaseException) -> Rule | None:
    """The rule of the nearest class in the exception's MRO; None for an exception no rule covers."""
    for cls in type(exc).__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            return rule
    return None


def describe(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
    """The wire code, message and extra envelope fields of a known exception."""
    if isinstance(exc, GatewayError):
        return exc.code, exc.message, exc.extra
    if isinstance(exc, DecodeError):
        return codes.INVALID_INPUT, str(exc), {}
    if isinstance(exc, PoolError):
        return exc.code, exc.message, {}
    if isinstance(exc, BodyTooLargeError):
        return codes.PAYLOAD_TOO_LARGE, exc.message, {}
    if isinstance(exc, BodyIncompleteError):
        return codes.INVALID_INPUT, str(exc), {}
    if isinstance(exc, BundleConflictError):
        return codes.BUNDLE_CONFLICT, str(exc), {"compatible_bundles": exc.compatible_bundles}
    if isinstance(exc, ModelNotFoundError):
        return codes.MODEL_NOT_FOUND, str(exc), {}
    return codes.INTERNAL_ERROR, INTERNAL_MESSAGE, {}


def error_reply(exc: BaseException, surface: Surface = Surface.NATIVE) -> ErrorReply:
    """The answer to `exc` on `surface`; an exception no rule covers is logged and becomes a 500."""
    rule = rule_for(exc)
    if rule is None:
        logger.error("unhandled error while serving a request", exc_info=exc)
        rule, (code, message, extra) = _INTERNAL, (codes.INTERNAL_ERROR, INTERNAL_MESSAGE, {})
    else:
        code, message, extra = describe(exc)
    headers = dict(VERSION_HEADERS)
    if isinstance(exc, RetryableError):
        headers[RETRY_AFTER] = str(exc.retry_after_s)
    if rule.envelope is Envelope.RETRY:
        headers[ERROR_CODE] = code
    if isinstance(exc, UnauthorizedError):
        headers[WWW_AUTHENTICATE] = BEARER_CHALLENGE
    if surface in (Surface.TEI, Surface.COHERE, Surface.OLLAMA, Surface.KSERVE):
        # Their bodies carry no code: the SIE code rides in the header, as for OpenAI.
        headers.setdefault(ERROR_CODE, code)
        return _dialect(surface, rule.status, message, headers)
    if surface is Surface.OPENAI:
        # OpenAI's body code is coarser (`invalid_request` for every 400): the SIE code rides in the header, which
        # SIE clients read first (an INPUT_TOO_LONG stays one).
        headers.setdefault(ERROR_CODE, code)
        return ErrorReply(rule.status, _openai(exc, rule.status, code, message), headers)
    return ErrorReply(rule.status, _native(exc, rule.envelope, code, message, extra), headers)


def _native(exc: BaseException, envelope: Envelope, code: str, message: str, extra: dict[str, Any]) -> Any:
    if envelope is Envelope.RETRY:
        return retry_body(code, message, **extra)
    if envelope is Envelope.ITEMS and isinstance(exc, AllItemsFailedError):
        return all_items_failed_body(exc.details)
    if envelope is Envelope.STATUS:
        return status_body(code, message, **extra)
    return detail_body(code, message, **extra)


def _openai(exc: BaseException, status: int, code: str, message: str) -> Any:
    error_type = codes.OPENAI_INVALID_REQUEST_ERROR if status < 500 else OPENAI_SERVER_ERROR
    param = _OPENAI_PARAMS.get(type(exc))
    if isinstance(exc, GatewayError):
        param = exc.extra.get("param", param)
    if isinstance(exc, AllItemsFailedError):
        code = "all_items_failed"
    if isinstance(exc, PoolError):  # not the model: the pool the request named
        return openai_body(message, error_type, "pool", code)
    return openai_body(message, error_type, param, _OPENAI_CODES.get(status, code))


def _dialect(surface: Surface, status: int, message: str, headers: dict[str, str]) -> ErrorReply:
    if surface is Surface.TEI:  # TEI answers validation failures 422, overload 429-like as "Overloaded"
        error_type = "Validation" if status < 500 else ("Overloaded" if status == 503 else "Backend")
        return ErrorReply(422 if status == 400 else status, {"error": message, "error_type": error_type}, headers)
    if surface is Surface.COHERE:
        return ErrorReply(status, {"message": message}, headers)
    return ErrorReply(status, {"error": message}, headers)


def surface_for_path(path: str) -> Surface:
    """The envelope family of a request path (used where no route has been matched yet)."""
    if path in OPENAI_PATHS or path.startswith(OPENAI_PREFIXES):
        return Surface.OPENAI
    if path in COHERE_PATHS:
        return Surface.COHERE
    if path in OLLAMA_PATHS:
        return Surface.OLLAMA
    if path == "/v2" or path.startswith(("/v2/models/", "/v2/health/")):
        return Surface.KSERVE
    if path.endswith(TEI_OPENAI_SUFFIX) and not path.startswith(("/v1/", "/v2/")):
        return Surface.OPENAI
    if path.endswith(TEI_SUFFIXES) and not path.startswith("/v1/"):
        return Surface.TEI
    return Surface.NATIVE


def stream_error(exc: BaseException) -> dict[str, Any]:
    """The `error` object of a terminal SSE event, for a failure after the stream began: `{code, message, type,
    param}` with the SIE code (the SDK reads `code`), and `retry_after_s` for RESOURCE_EXHAUSTED."""
    rule = rule_for(exc)
    if rule is None:
        logger.error("unhandled error while streaming a generation", exc_info=exc)
        rule, code, message = _INTERNAL, codes.INTERNAL_ERROR, INTERNAL_MESSAGE
    else:
        code, message, _ = describe(exc)
    param = exc.extra.get("param") if isinstance(exc, GatewayError) else None
    error_type = codes.OPENAI_INVALID_REQUEST_ERROR if rule.status < 500 else OPENAI_SERVER_ERROR
    error: dict[str, Any] = {"code": code, "message": message, "type": error_type, "param": param}
    if isinstance(exc, RetryableError) and code == codes.RESOURCE_EXHAUSTED:
        error["retry_after_s"] = exc.retry_after_s
    return error


def route_error_reply(status: int, detail: str) -> ErrorReply:
    """Unknown route or method: FastAPI's `{"detail": "Not Found"}` shape, as sie-server answers."""
    return ErrorReply(status, {"detail": detail}, dict(VERSION_HEADERS))


async def send_error_reply(
    exc: BaseException, path: str, send: Callable[[MutableMapping[str, Any]], Awaitable[None]]
) -> None:
    """Answer `exc` straight on an ASGI `send`, in the envelope of `path`'s surface: for the gateway's pure ASGI
    middlewares (shutdown, auth), which refuse before any route runs."""
    reply = error_reply(exc, surface_for_path(path))
    content = reply.content()
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
