"""OpenAI `/v1/embeddings` parsing, reply cap and shape (seed 000 §2; contracts Part B §1.5, A §2.6, §10.6)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from sie.gateway.errors import InvalidRequestError, PayloadTooLargeError
from sie.gateway.openai import (
    MAX_COMPAT_RESPONSE_BODY,
    EmbeddingsCall,
    check_reply_size,
    embeddings_body,
    parse_embeddings,
)
from sie.wire import packb
from sie.wire.queue import UnitCounts, WorkResult


def result(index: int, values: list[float], tokens: int | None = None) -> WorkResult:
    payload = {"dense": {"dims": len(values), "dtype": "float32", "values": np.array(values, dtype=np.float32)}}
    units = UnitCounts(input_tokens=tokens) if tokens is not None else None
    return WorkResult(
        work_item_id=f"r.{index}", request_id="r", item_index=index, success=True, result_msgpack=packb(payload),
        units=units,
    )  # fmt: skip


def test_string_and_list_inputs() -> None:
    assert parse_embeddings({"model": "m", "input": "hi"}) == EmbeddingsCall("m", ["hi"], "float")
    call = parse_embeddings(
        {"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8, "user": "u"}
    )
    assert call == EmbeddingsCall("m", ["a", "b"], "base64")
    request = call.encode_request()
    assert [item.text for item in request.items] == ["a", "b"]
    assert request.params.output_types == ["dense"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "x"}, "model", "Field 'model' is required"),
        ({"model": "m", "input": []}, "input", "Input cannot be empty"),
        ({"model": "m", "input": [1, 2, 3]}, "input", "Token-id inputs are not supported"),
        ({"model": "m", "input": [[1, 2], [3]]}, "input", "Token-id inputs are not supported"),
        ({"model": "m", "input": [{"text": "x"}]}, "input", "must be a string or a list of strings"),
        ({"model": "m"}, "input", "must be a string or a list of strings"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "must be one of"),
    ],
)
def test_refusals_name_their_param(body: dict, param: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        parse_embeddings(body)
    assert caught.value.extra["param"] == param


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequestError, match="JSON object"):
        parse_embeddings(["m"])


def test_float_body_with_worker_token_counts() -> None:
    call = EmbeddingsCall("m", ["hello", "world"])
    body = embeddings_body(call, [result(0, [0.5, -1.0], 3), result(1, [2.0, 0.0], 4)])
    assert body["object"] == "list" and body["model"] == "m"
    assert [(d["object"], d["index"], d["embedding"].tolist()) for d in body["data"]] == [
        ("embedding", 0, [0.5, -1.0]), ("embedding", 1, [2.0, 0.0]),
    ]  # fmt: skip
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7, "sie_token_source": "worker"}


def test_base64_is_little_endian_float32_and_usage_falls_back_to_characters() -> None:
    body = embeddings_body(EmbeddingsCall("m", ["x" * 40], "base64"), [result(0, [0.5, -1.0, 2.0])])
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [0.5, -1.0, 2.0]
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10, "sie_token_source": "character_estimate"}


def test_reply_over_16_mib_names_the_remedy() -> None:
    big = WorkResult(
        work_item_id="r.0", request_id="r", item_index=0, success=True,
        result_msgpack=b"\x00" * (MAX_COMPAT_RESPONSE_BODY + 1),
    )  # fmt: skip
    with pytest.raises(PayloadTooLargeError, match="send fewer inputs per request"):
        check_reply_size([big])
    check_reply_size([result(0, [1.0])])
