"""Reading error responses the way sie-sdk 0.10.1 does (sie.client._failures; contracts Part A §2.5, Part B §1.7)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import msgpack
import pytest

from sie.client._failures import ErrorResponse, error_for, parse_retry_after, read_error_response
from sie.client.errors import (
    IncompleteBatchError,
    InputTooLongError,
    LoraLoadingError,
    ModelLoadFailedError,
    ModelLoadingError,
    ProvisioningError,
    RateLimitError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEConnectionError,
    SIEError,
    SIETimeoutError,
)


def json_headers(**extra: str) -> httpx.Headers:
    return httpx.Headers({"content-type": "application/json", **extra})


def read(status: int, body: object, *, msgpack_body: bool = False, **headers: str) -> ErrorResponse:
    if msgpack_body:
        content = msgpack.packb(body, use_bin_type=True)
        header_map = httpx.Headers({"content-type": "application/msgpack", **headers})
    else:
        content = json.dumps(body).encode()
        header_map = json_headers(**headers)
    return read_error_response(status, header_map, content)


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({"error": {"code": "MODEL_LOADING", "message": "loading"}}, "MODEL_LOADING", "loading"),
        ({"error": "all_items_failed", "details": []}, None, "all_items_failed"),
        (
            {"detail": {"code": "MODEL_NOT_FOUND", "message": "Model 'x' not found"}},
            "MODEL_NOT_FOUND",
            "Model 'x' not found",
        ),
        ({"detail": "Not Found"}, None, "Not Found"),
        ({"detail": {"code": "X"}}, "X", "{'code': 'X'}"),
        ({"error": {"code": "Y"}}, "Y", "HTTP 503"),
        ({"message": "gateway says no"}, None, "HTTP 503"),
        ([1, 2], None, "HTTP 503"),
    ],
)
def test_error_and_detail_envelopes(body, code, message):
    for msgpack_body in (False, True):
        parsed = read(503, body, msgpack_body=msgpack_body)
        assert (parsed.code, parsed.message) == (code, message)


def test_error_is_read_before_detail():
    parsed = read(503, {"detail": {"code": "A"}, "error": {"code": "B", "message": "b"}})
    assert parsed.code == "B"


def test_the_header_code_overrides_the_body_code():
    parsed = read(
        503, {"error": {"code": "MODEL_LOADING", "message": "m"}}, **{"X-SIE-Error-Code": "RESOURCE_EXHAUSTED"}
    )
    assert parsed.code == "RESOURCE_EXHAUSTED"
    assert parsed.message == "m"


def test_the_header_code_alone_is_enough():
    parsed = read_error_response(503, httpx.Headers({"X-SIE-Error-Code": "QUEUE_FULL"}), b"")
    assert parsed.code == "QUEUE_FULL"


@pytest.mark.parametrize("where", ["body", "header"])
def test_lowercase_provisioning_is_normalized(where):
    if where == "body":
        parsed = read(503, {"error": {"code": "provisioning", "message": "wait"}})
    else:
        parsed = read(503, {}, **{"X-SIE-Error-Code": "provisioning"})
    assert parsed.code == "PROVISIONING"


def test_a_body_that_does_not_parse_becomes_the_message():
    parsed = read_error_response(500, json_headers(), b"Internal Server Error")
    assert (parsed.code, parsed.message) == (None, "Internal Server Error")
    empty = read_error_response(502, httpx.Headers({"content-type": "application/msgpack"}), b"\xc1")
    assert empty.code is None


def test_json_is_the_default_when_the_content_type_is_not_msgpack():
    parsed = read_error_response(404, httpx.Headers({}), b'{"detail":{"code":"MODEL_NOT_FOUND","message":"m"}}')
    assert parsed.code == "MODEL_NOT_FOUND"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5", 5.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("-3", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
    ],
)
def test_retry_after(value, seconds):
    now = datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)
    assert parse_retry_after(value, now=now) == seconds


def test_a_junk_retry_after_never_crashes_the_reader():
    parsed = read(503, {"error": {"code": "MODEL_LOADING"}}, **{"Retry-After": "-7"})
    assert parsed.retry_after is None


def test_model_load_failed_fields():
    body = {
        "detail": {
            "code": "MODEL_LOAD_FAILED",
            "message": "gated",
            "error_class": "GATED",
            "permanent": False,
            "attempts": 2,
        }
    }
    error = error_for(read(502, body), model="org/m")
    assert isinstance(error, ModelLoadFailedError)
    assert isinstance(error, ServerError)
    assert (error.error_class, error.permanent, error.attempts, error.model) == ("GATED", False, 2, "org/m")
    assert (error.code, error.status_code, str(error)) == ("MODEL_LOAD_FAILED", 502, "gated")


@pytest.mark.parametrize("attempts", ["n/a", "inf", -5, 0, None, [1]])
def test_model_load_failed_attempts_are_coerced_to_at_least_one(attempts):
    error = error_for(read(502, {"error": {"code": "MODEL_LOAD_FAILED", "attempts": attempts}}), model="org/m")
    assert isinstance(error, ModelLoadFailedError)
    assert error.attempts == 1
    assert error.permanent is True
    assert str(error) == "Model 'org/m' failed to load"


@pytest.mark.parametrize(
    ("status", "code", "error_class"),
    [
        (400, "INVALID_INPUT", RequestError),
        (400, "INPUT_TOO_LONG", InputTooLongError),
        (404, "MODEL_NOT_FOUND", RequestError),
        (413, None, RequestError),
        (429, "RATE_LIMIT", RateLimitError),
        (500, "all_items_failed", ServerError),
        (502, "MODEL_LOAD_FAILED", ModelLoadFailedError),
        (503, "PROVISIONING", ProvisioningError),
        (503, "QUEUE_FULL", ServerError),
        (504, "GATEWAY_TIMEOUT", ServerError),
    ],
)
def test_terminal_error_classes(status, code, error_class):
    error = error_for(ErrorResponse(status_code=status, code=code, message="m", retry_after=2.0), model="m")
    assert type(error) is error_class
    if isinstance(error, RequestError | ServerError):
        assert error.status_code == status


def test_the_param_the_server_blamed_is_kept():
    error = error_for(read(400, {"error": {"code": "INVALID_INPUT", "message": "m", "param": "items"}}))
    assert isinstance(error, RequestError)
    assert error.param == "items"


def test_hierarchy_matches_sie_sdk():
    assert issubclass(SIETimeoutError, SIEConnectionError) and issubclass(SIETimeoutError, TimeoutError)
    for cls in (InputTooLongError, RateLimitError):
        assert issubclass(cls, RequestError)
    for cls in (ModelLoadFailedError, ResourceExhaustedError, IncompleteBatchError):
        assert issubclass(cls, ServerError)
    for cls in (SIEConnectionError, RequestError, ServerError, ProvisioningError, ModelLoadingError, LoraLoadingError):
        assert cls.__bases__ == (SIEError,)


@pytest.mark.parametrize("content_type", ["application/msgpack", "application/x-msgpack", "application/vnd.msgpack"])
def test_msgpack_error_bodies_under_every_msgpack_label(content_type):
    content = msgpack.packb({"error": {"code": "QUEUE_FULL", "message": "full"}}, use_bin_type=True)
    parsed = read_error_response(503, httpx.Headers({"content-type": content_type}), content)
    assert (parsed.code, parsed.message) == ("QUEUE_FULL", "full")
