"""The exceptions the SIE client raises, one class per thing a caller handles differently (contracts Part A §2.5).

Names, bases and fields match the public `sie-sdk` 0.10.1, so `except` clauses written for it keep working:

SIEError
├── SIEConnectionError ········· could not reach the server, or the connection broke
│   └── SIETimeoutError ········ a timeout (also a TimeoutError); a read timeout is never retried
├── RequestError ··············· 4xx, or a response that breaks the wire contract
│   ├── InputTooLongError ······ 400 INPUT_TOO_LONG
│   └── RateLimitError ········· 429 once the retry budget is spent
├── ServerError ················ 5xx
│   ├── ModelLoadFailedError ··· 502 MODEL_LOAD_FAILED: a recorded load failure, never retried
│   ├── ResourceExhaustedError · 503 RESOURCE_EXHAUSTED after `max_oom_retries`
│   └── IncompleteBatchError ··· a 200 whose result count differs from the inputs
├── ProvisioningError ·········· 503 PROVISIONING without `wait_for_capacity`, or past the budget
├── ModelLoadingError ·········· 503 MODEL_LOADING past the budget
└── LoraLoadingError ··········· 503 LORA_LOADING after 10 retries
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class SIEError(Exception):
    """Base class of every error the SIE client raises."""


class SIEConnectionError(SIEError):
    """The server could not be reached, or the connection broke before a full response arrived."""


class SIETimeoutError(SIEConnectionError, TimeoutError):
    """A connect, write or read timeout; catch it as SIEConnectionError or as TimeoutError."""


class RequestError(SIEError):
    """The server refused the request (4xx), or its answer broke the wire contract."""

    def __init__(
        self, message: str, code: str | None = None, status_code: int | None = None, *, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.param = param


class InputTooLongError(RequestError):
    """400 INPUT_TOO_LONG: an input exceeds the model's maximum token capacity."""

    def __init__(self, message: str, *, model: str | None = None, param: str | None = None) -> None:
        super().__init__(message, "INPUT_TOO_LONG", 400, param=param)
        self.model = model


class RateLimitError(RequestError):
    """429: the caller is rate-limited and the retry budget is spent; `retry_after` is the last hint."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = "RATE_LIMIT",
        retry_after: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, code, 429, param=param)
        self.retry_after = retry_after


class ServerError(SIEError):
    """The server failed (5xx); `retry_after` keeps a valid server hint, if any."""

    def __init__(
        self,
        message: str,
        code: str | None = None,
        status_code: int | None = None,
        *,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.param = param
        self.retry_after = retry_after


class ModelLoadFailedError(ServerError):
    """502 MODEL_LOAD_FAILED: the server recorded a failed load; raised on the first response, never retried."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        error_class: str | None = None,
        permanent: bool = True,
        attempts: int = 1,
        param: str | None = None,
    ) -> None:
        super().__init__(message, "MODEL_LOAD_FAILED", 502, param=param)
        self.model = model
        self.error_class = error_class
        self.permanent = permanent
        self.attempts = max(attempts, 1)


class ResourceExhaustedError(ServerError):
    """503 RESOURCE_EXHAUSTED (server out of memory) after `retries` retries, or when the budget ran out."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        retries: int = 0,
        retry_after: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, "RESOURCE_EXHAUSTED", 503, param=param, retry_after=retry_after)
        self.model = model
        self.retries = retries


class IncompleteBatchError(ServerError):
    """A 200 whose result count differs from the inputs; `results` keeps what did come back."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        expected: int,
        received: int,
        model: str | None = None,
        results: Sequence[Any] = (),
    ) -> None:
        super().__init__(message, code)
        self.expected = expected
        self.received = received
        self.model = model
        self.results = list(results)


class ProvisioningError(SIEError):
    """503 PROVISIONING: no capacity yet for `gpu`, and the caller would not (or could no longer) wait."""

    def __init__(
        self,
        message: str,
        *,
        gpu: str | None = None,
        retry_after: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.gpu = gpu
        self.retry_after = retry_after
        self.param = param


class ModelLoadingError(SIEError):
    """503 MODEL_LOADING: the model was still loading when the provisioning budget ran out."""

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(message)
        self.model = model


class LoraLoadingError(SIEError):
    """503 LORA_LOADING: the LoRA adapter was still loading after the fixed number of retries."""

    def __init__(self, message: str, *, lora: str | None = None, model: str | None = None) -> None:
        super().__init__(message)
        self.lora = lora
        self.model = model
