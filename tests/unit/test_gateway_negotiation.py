"""Content negotiation and body decoding at the gateway edge (contracts Part B §1.9, §7.1 items 5–6)."""

from __future__ import annotations

import numpy as np
import pytest

from sie.gateway.http.negotiation import decode_request, is_msgpack_body, render, wants_msgpack
from sie.wire import DecodeError, loads_json, packb
from sie.wire.http import EncodeRequest, ExtractRequest, ScoreRequest

# contracts Part B §1.9: msgpack of {"model":"m","items":[{"dense":{"dims":3,"dtype":"float32","values":[0.5,-1,2]}}]}
VECTOR_HEX = (
    "82a56d6f64656ca16da56974656d739181a564656e736583a464696d7303a56474797065a7666c6f61743332a676616c75657385"
    "c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659103c40464617461c40c0000003f000080bf00000040"
)


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/msgpack", True),
        ("application/x-msgpack", True),
        ("application/msgpack; charset=binary", True),
        ("application/json", False),
        (None, False),
    ],
)
def test_request_body_format(content_type: str | None, expected: bool) -> None:
    assert is_msgpack_body(content_type) is expected


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),
        ("*/*", False),
        ("application/json", False),
        ("application/msgpack", True),
        ("application/x-msgpack", True),
        ("application/vnd.msgpack", True),
        ("application/json;q=0.5, application/msgpack", True),
    ],
)
def test_gateway_answers_json_unless_accept_names_msgpack(accept: str | None, expected: bool) -> None:
    assert wants_msgpack(accept) is expected


def test_msgpack_render_is_the_contract_vector() -> None:
    values = np.array([0.5, -1, 2], dtype=np.float32)
    body = {"model": "m", "items": [{"dense": {"dims": 3, "dtype": "float32", "values": values}}]}
    content, media_type = render(body, msgpack=True)
    assert (content.hex(), media_type) == (VECTOR_HEX, "application/msgpack")


def test_json_render_expands_arrays_and_float16() -> None:
    values = np.array([0.5, -1, 2], dtype=np.float16)
    content, media_type = render({"values": values}, msgpack=False)
    assert (loads_json(content), media_type) == ({"values": [0.5, -1.0, 2.0]}, "application/json")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"items": ["just a string"]}', "Expected `object`, got `str` - at `$.items[0]`"),
        (b'{"items": [{"text": 123}]}', "Expected `str | null`, got `int` - at `$.items[0].text`"),
        (b'{"items": []}', "Field 'items' must not be empty"),
        (b"{}", "Object missing required field `items`"),
        (b"[]", "Expected `object`, got `array`"),
    ],
)
def test_decode_errors_name_the_field(body: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode_request(body, "application/json", EncodeRequest)
    assert str(caught.value) == message


def test_malformed_bodies_are_decode_errors() -> None:
    with pytest.raises(DecodeError, match="JSON is malformed"):
        decode_request(b"{", None, EncodeRequest)
    with pytest.raises(DecodeError, match="MessagePack data is malformed"):
        decode_request(b"\xc1", "application/msgpack", EncodeRequest)


@pytest.mark.parametrize("trailing", [b"\x01", b"\x01\x02", packb({"items": [{"text": "b"}]}), b"\xc1"])
def test_msgpack_bodies_with_bytes_after_their_object_are_refused(trailing: bytes) -> None:
    body = packb({"items": [{"text": "a"}]})
    assert decode_request(body, "application/msgpack", EncodeRequest).items[0].text == "a"
    with pytest.raises(DecodeError, match="bytes follow the end of the body's object"):
        decode_request(body + trailing, "application/msgpack", EncodeRequest)
    # One byte is the smallest whole body; its check reads an empty prefix.
    with pytest.raises(DecodeError, match="Object missing required field `items`"):
        decode_request(b"\x80", "application/msgpack", EncodeRequest)


def test_unknown_fields_are_ignored_and_base64_media_is_decoded() -> None:
    body = b'{"items":[{"text":"a","extra":1,"images":[{"data":"aGVsbG8=","format":"png"}]}],"zzz":true}'
    request = decode_request(body, "application/json", EncodeRequest)
    assert request.items[0].images[0].data == b"hello"


def test_msgpack_bodies_decode_into_the_same_types() -> None:
    score = packb({"query": {"text": "q"}, "items": [{"text": "a"}], "options": {"profile": "default"}})
    request = decode_request(score, "application/x-msgpack", ScoreRequest)
    assert (request.query.text, request.options) == ("q", {"profile": "default"})
    extract = packb({"items": [{"text": "a"}], "params": {"labels": ["person"]}})
    assert decode_request(extract, "application/msgpack", ExtractRequest).params.labels == ["person"]
