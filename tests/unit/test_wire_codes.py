"""Error code constants (sie.wire.codes)."""

import pytest

from sie.wire import codes

SIE_CODES = [
    "INVALID_INPUT",
    "MODEL_NOT_FOUND",
    "MODEL_NOT_LOADED",
    "LORA_LOADING",
    "MODEL_LOADING",
    "MODEL_LOAD_FAILED",
    "INFERENCE_ERROR",
    "QUEUE_FULL",
    "INTERNAL_ERROR",
    "RESOURCE_EXHAUSTED",
    "INPUT_TOO_LONG",
    "PROVISIONING",
    "GATEWAY_TIMEOUT",
    "PAYLOAD_TOO_LARGE",
]


@pytest.mark.parametrize("name", SIE_CODES)
def test_upper_case_codes_are_spelled_as_their_names(name):
    assert getattr(codes, name) == name


def test_queue_path_inference_error_is_lower_case():
    assert codes.QUEUE_INFERENCE_ERROR == "inference_error"


def test_retryable_worker_codes_are_the_three_the_gateway_recognises():
    assert {"RESOURCE_EXHAUSTED", "MODEL_LOADING", "LORA_LOADING"} == codes.RETRYABLE_WORKER_CODES
