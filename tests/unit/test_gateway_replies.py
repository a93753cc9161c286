"""The gateway's one exception → HTTP mapping (seed 000 §2, contracts Part B §1.7, Part A §2.5–2.6)."""

from __future__ import annotations

import pytest

from sie.catalog import BundleConflictError, ModelNotFoundError
from sie.gateway import errors as gx
from sie.gateway.http.replies import (
    RULES,
    Surface,
    describe,
    error_reply,
    route_error_reply,
    rule_for,
    surface_for_path,
)
from sie.wire import DecodeError, loads_json

# (exception, status, code, native envelope key, Retry-After or None, X-SIE-Error-Code or None)
TABLE = [
    (DecodeError("Expected `object`, got `str`", "$.items[0]"), 400, "INVALID_INPUT", "detail", None, None),
    (gx.InvalidRequestError("Profile 'x' not found"), 400, "INVALID_INPUT", "detail", None, None),
    (gx.InvalidRequestError("Item 1: too long", code="INPUT_TOO_LONG"), 400, "INPUT_TOO_LONG", "detail", None, None),
    (gx.UnauthorizedError("no token"), 401, "UNAUTHORIZED", "detail", None, None),
    (gx.ForbiddenError("not the admin token"), 403, "FORBIDDEN", "detail", None, None),
    (ModelNotFoundError("acme/missing"), 404, "MODEL_NOT_FOUND", "detail", None, None),
    (gx.NotFoundError("No dead letter 7"), 404, "NOT_FOUND", "detail", None, None),
    (BundleConflictError("org/m", "gpu", ["default"]), 409, "BUNDLE_CONFLICT", "detail", None, None),
    (gx.PayloadTooLargeError("too big"), 413, "PAYLOAD_TOO_LARGE", "detail", None, None),
    (gx.ClientDisconnectedError("gone"), 499, "CLIENT_CLOSED_REQUEST", "detail", None, None),
    (gx.AllItemsFailedError("All 2 items failed", []), 500, None, "error", None, None),
    (RuntimeError("boom; this is a bug"), 500, "INTERNAL_ERROR", "detail", None, None),
    (
        gx.ModelLoadFailedError("gated", error_class="GATED", attempts=1, permanent=True),
        502, "MODEL_LOAD_FAILED", "error", None, "MODEL_LOAD_FAILED",
    ),
    (gx.MachineProfileNotConfiguredError("h100", ("l4",)), 503, None, "status", None, None),
    (gx.ProvisioningError("no worker"), 503, "PROVISIONING", "error", "60", "PROVISIONING"),
    (gx.QueueFullError("full"), 503, "QUEUE_FULL", "error", "5", "QUEUE_FULL"),
    (gx.QueueUnavailableError("down"), 503, "QUEUE_UNAVAILABLE", "error", "5", "QUEUE_UNAVAILABLE"),
    (gx.ShuttingDownError("draining"), 503, "SHUTTING_DOWN", "error", "5", "SHUTTING_DOWN"),
    (gx.WorkerRetryableError("loading", code="MODEL_LOADING"), 503, "MODEL_LOADING", "error", "5", "MODEL_LOADING"),
    (gx.WorkerRetryableError("lora", code="LORA_LOADING"), 503, "LORA_LOADING", "error", "5", "LORA_LOADING"),
    (
        gx.WorkerRetryableError("oom", code="RESOURCE_EXHAUSTED", retry_after_s=12),
        503, "RESOURCE_EXHAUSTED", "error", "12", "RESOURCE_EXHAUSTED",
    ),
    (gx.GatewayTimeoutError("late"), 504, "GATEWAY_TIMEOUT", "error", "5", "GATEWAY_TIMEOUT"),
]  # fmt: skip


@pytest.mark.parametrize(("exc", "status", "code", "key", "retry_after", "header_code"), TABLE)
def test_native_status_code_envelope_and_headers(exc, status, code, key, retry_after, header_code) -> None:
    reply = error_reply(exc)
    body = loads_json(reply.content())
    assert reply.status == status
    assert key in body
    if code is not None:
        assert body[key]["code"] == code
    assert reply.headers.get("retry-after") == retry_after
    assert reply.headers.get("x-sie-error-code") == header_code
    assert reply.headers["x-sie-version"] == reply.headers["x-sie-server-version"]


@pytest.mark.parametrize(("exc", "status", "code", "key", "retry_after", "header_code"), TABLE)
def test_openai_surface_keeps_status_and_headers_in_openai_envelope(
    exc, status, code, key, retry_after, header_code
) -> None:
    reply = error_reply(exc, Surface.OPENAI)
    error = loads_json(reply.content())["error"]
    assert reply.status == status
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert reply.headers.get("retry-after") == retry_after
    # The SIE code the OpenAI body code may coarsen (`invalid_request`) is in the header SIE clients read first.
    assert reply.headers["x-sie-error-code"] == (header_code or code or describe(exc)[0])


def test_every_gateway_error_class_has_a_rule() -> None:
    def subclasses(cls: type) -> list[type]:
        return [cls] + [sub for child in cls.__subclasses__() for sub in subclasses(child)]

    for cls in subclasses(gx.GatewayError)[1:]:
        assert rule_for(cls.__new__(cls)) is not None, cls


def test_model_not_found_message_is_sie_servers() -> None:
    body = loads_json(error_reply(ModelNotFoundError("acme/missing")).content())
    assert body == {"detail": {"code": "MODEL_NOT_FOUND", "message": "Model 'acme/missing' not found"}}


def test_bundle_conflict_lists_compatible_bundles_inside_detail() -> None:
    body = loads_json(error_reply(BundleConflictError("org/m", "gpu", ["default", "fast"])).content())
    assert body["detail"]["compatible_bundles"] == ["default", "fast"]


def test_model_load_failed_is_the_sdk_error_object_without_retry_after() -> None:
    exc = gx.ModelLoadFailedError("Model is gated", error_class="GATED", attempts=1, permanent=True)
    reply = error_reply(exc)
    assert loads_json(reply.content()) == {
        "error": {
            "code": "MODEL_LOAD_FAILED",
            "message": "Model is gated",
            "error_class": "GATED",
            "attempts": 1,
            "permanent": True,
        }
    }
    assert "retry-after" not in reply.headers


def test_an_unconfigured_machine_profile_answers_the_public_gateways_status_body() -> None:
    reply = error_reply(gx.MachineProfileNotConfiguredError("h100", ("l4", "a100-80gb")))
    assert reply.status == 503 and "retry-after" not in reply.headers
    assert loads_json(reply.content()) == {
        "status": "gpu_not_configured",
        "gpu": "h100",
        "configured_gpu_types": ["l4", "a100-80gb"],
        "message": "Machine profile 'h100' is not configured in this cluster; configured: l4, a100-80gb",
    }


def test_all_items_failed_body_lists_details() -> None:
    details = [{"item_index": 0, "error": "x", "code": "inference_error"}, {"item_index": 1, "error": "y"}]
    body = loads_json(error_reply(gx.AllItemsFailedError("All 2 items failed", details)).content())
    assert body == {"error": "all_items_failed", "details": details}


def test_unexpected_error_is_logged_and_never_leaks_its_text(caplog: pytest.LogCaptureFixture) -> None:
    reply = error_reply(KeyError("secret internals"))
    assert loads_json(reply.content()) == {"detail": {"code": "INTERNAL_ERROR", "message": "Internal server error"}}
    assert "unhandled error" in caplog.text


def test_openai_codes_for_client_errors() -> None:
    not_found = loads_json(error_reply(ModelNotFoundError("x"), Surface.OPENAI).content())["error"]
    assert not_found == {
        "message": "Model 'x' not found",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    invalid = gx.InvalidRequestError("Token-id inputs are not supported", param="input")
    error = loads_json(error_reply(invalid, Surface.OPENAI).content())["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "input")


def test_rules_are_searched_along_the_mro() -> None:
    class Custom(gx.QueueFullError):
        pass

    assert rule_for(Custom("x")) == RULES[gx.RetryableError]
    assert rule_for(gx.GatewayTimeoutError("x")).status == 504


def test_route_errors_and_surfaces() -> None:
    assert loads_json(route_error_reply(404, "Not Found").content()) == {"detail": "Not Found"}
    assert surface_for_path("/v1/embeddings") is Surface.OPENAI
    assert surface_for_path("/v1/encode/x") is Surface.NATIVE


@pytest.mark.parametrize(("path", "surface"), [
    ("/org/model/v1/embeddings", Surface.OPENAI),
    ("/org/model/embeddings", Surface.OPENAI),
    ("/api/embeddings", Surface.OLLAMA),
    ("/org/model/embed", Surface.TEI),
    ("/v2/rerank", Surface.COHERE),
    ("/v2/models/org/model/infer", Surface.KSERVE),
    ("/v1/encode/org/embeddings", Surface.NATIVE),
])  # fmt: skip
def test_a_dialect_path_is_answered_in_its_envelope_before_any_route_matched(path: str, surface: Surface) -> None:
    assert surface_for_path(path) is surface
