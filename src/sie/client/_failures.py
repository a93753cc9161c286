"""What an HTTP error response means to the client: its code, message and Retry-After, and the exception it becomes.

Parsing follows the sie-sdk 0.10.1 reader exactly (contracts Part A §2.5, Part B §1.7); pure, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import attrs

from sie.client.errors import (
    InputTooLongError,
    ModelLoadFailedError,
    ProvisioningError,
    RateLimitError,
    RequestError,
    ServerError,
    SIEError,
)
from sie.wire import DecodeError, loads_json, unpackb
from sie.wire.codes import INPUT_TOO_LONG, MODEL_LOAD_FAILED, PROVISIONING

ERROR_CODE_HEADER = "X-SIE-Error-Code"


@attrs.frozen(kw_only=True)
class ErrorResponse:
    """One error response as the retry ladder sees it; `fields` is the `error`/`detail` map, if it was one."""

    status_code: int
    code: str | None = None
    message: str = ""
    retry_after: float | None = None
    fields: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def param(self) -> str | None:
        """The request field the server blamed, when the envelope names one."""
        param = self.fields.get("param")
        return param if isinstance(param, str) else None


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After value (number or HTTP date); None when absent, negative, non-finite or junk.

    A bad hint becomes "no hint" so the caller falls back to its default delay: a negative or NaN value
    would crash `time.sleep` or make `asyncio.sleep` return at once and burn the budget.
    """
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return _seconds_until(value, now)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def _seconds_until(http_date: str, now: datetime | None) -> float | None:
    try:
        when = parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def read_error_response(status_code: int, headers: Mapping[str, str], content: bytes) -> ErrorResponse:
    """Parse an error body (msgpack when the content-type says so, else JSON); the header code wins over the body's."""
    code, message, fields = _read_envelope(status_code, headers, content)
    header_code = headers.get(ERROR_CODE_HEADER)
    if header_code:
        code = header_code
    return ErrorResponse(
        status_code=status_code,
        code=_normalize_code(code),
        message=message,
        retry_after=parse_retry_after(headers.get("Retry-After")),
        fields=fields,
    )


def _read_envelope(status_code: int, headers: Mapping[str, str], content: bytes) -> tuple[Any, str, Mapping[str, Any]]:
    fallback = f"HTTP {status_code}"
    try:
        # sie-sdk looks for `application/msgpack`; `x-msgpack` and `vnd.msgpack` (gateway labels) read the same.
        if "msgpack" in headers.get("content-type", ""):
            data = unpackb(content)
        else:
            data = loads_json(content)
    except DecodeError:
        return None, content.decode("utf-8", "replace") or fallback, {}
    if not isinstance(data, dict):
        return None, fallback, {}
    # `error` (gateway, SDK retry envelope) is read before `detail` (sie-server, FastAPI).
    envelope = data["error"] if "error" in data else data.get("detail")
    if isinstance(envelope, dict):
        message = envelope.get("message", fallback if "error" in data else str(envelope))
        return envelope.get("code"), str(message), envelope
    if envelope is None:
        return None, fallback, {}
    return None, str(envelope), {}


def _normalize_code(code: Any) -> str | None:
    if not isinstance(code, str) or not code:
        return None
    # The gateway once sent the lowercase form; sie-sdk treats it as PROVISIONING.
    return PROVISIONING if code == "provisioning" else code


def error_for(response: ErrorResponse, *, model: str | None = None) -> SIEError:
    """The exception a terminal error response becomes: the last rung of the ladder, and every non-retried call."""
    status, code, message = response.status_code, response.code, response.message
    if status == 502 and code == MODEL_LOAD_FAILED:
        return _model_load_failed(response, model)
    if status == 503 and code == PROVISIONING:
        return ProvisioningError(message, retry_after=response.retry_after, param=response.param)
    if status == 400 and code == INPUT_TOO_LONG:
        return InputTooLongError(message, model=model, param=response.param)
    if status == 429:
        return RateLimitError(message, code=code, retry_after=response.retry_after, param=response.param)
    if status >= 500:
        return ServerError(message, code, status, param=response.param, retry_after=response.retry_after)
    return RequestError(message, code, status, param=response.param)


def _model_load_failed(response: ErrorResponse, model: str | None) -> ModelLoadFailedError:
    fields = response.fields
    error_class = fields.get("error_class")
    return ModelLoadFailedError(
        str(fields.get("message") or f"Model '{model}' failed to load"),
        model=model,
        error_class=None if error_class is None else str(error_class),
        permanent=bool(fields.get("permanent", True)),
        attempts=_coerce_attempts(fields.get("attempts", 1)),
        param=response.param,
    )


def _coerce_attempts(raw: Any) -> int:
    # A server bug ("n/a", inf, -5) must not crash the caller's error handling.
    try:
        attempts = int(raw) if isinstance(raw, int | float | str) else 1
    except (TypeError, ValueError, OverflowError):
        attempts = 1
    return max(attempts, 1)
