"""Error body builders (sie.wire.envelopes)."""

from sie.wire import codes, dumps_json, loads_json
from sie.wire.envelopes import all_items_failed_body, detail_body, openai_body, retry_body


def test_detail_body_keeps_extra_fields_inside_detail():
    body = detail_body(codes.MODEL_LOAD_FAILED, "load failed", error_class="GATED", permanent=True, attempts=1)
    assert body == {
        "detail": {
            "code": "MODEL_LOAD_FAILED",
            "message": "load failed",
            "error_class": "GATED",
            "permanent": True,
            "attempts": 1,
        }
    }


def test_retry_body_is_the_sdk_retry_contract():
    body = retry_body(codes.RESOURCE_EXHAUSTED, "out of memory")
    assert loads_json(dumps_json(body)) == {"error": {"code": "RESOURCE_EXHAUSTED", "message": "out of memory"}}


def test_openai_body_always_has_four_keys():
    body = openai_body("Model 'x' not found", codes.OPENAI_INVALID_REQUEST_ERROR, code=codes.OPENAI_MODEL_NOT_FOUND)
    assert body == {
        "error": {
            "message": "Model 'x' not found",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }


def test_all_items_failed_body():
    details = [{"item_index": 0, "error": "oom", "code": "RESOURCE_EXHAUSTED"}, {"item_index": 1, "error": "x"}]
    assert all_items_failed_body(details) == {"error": "all_items_failed", "details": details}
