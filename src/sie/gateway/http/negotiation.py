"""Content negotiation at the HTTP edge (contracts Part B §1.9): request bodies are msgpack when Content-Type
says so, JSON otherwise; responses are msgpack only when Accept names msgpack (the gateway's JSON default).

Decoding maps a body onto the wire request types once (unknown fields ignored, base64 media decoded);
rendering serialises a whole body once (orjson with numpy, or msgpack with ndarray sentinel maps). Pure.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

from sie.wire import DecodeError, dumps_json, loads_json, packb, structure
from sie.wire.codec import unpackb_whole

T = TypeVar("T")

MSGPACK_REQUEST_TYPES: Final = ("application/msgpack", "application/x-msgpack")
MSGPACK_ACCEPT_TYPES: Final = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
# The label the public SDK detects (`"application/msgpack" in content-type`), which `x-msgpack` would not match.
MSGPACK_MEDIA_TYPE: Final = "application/msgpack"
JSON_MEDIA_TYPE: Final = "application/json"
_EMPTY_ITEMS: Final = "Expected `array` of length >= 1"


def is_msgpack_body(content_type: str | None) -> bool:
    """Whether a request body with this Content-Type is msgpack."""
    return content_type is not None and any(kind in content_type for kind in MSGPACK_REQUEST_TYPES)


def wants_msgpack(accept: str | None) -> bool:
    """Whether the response should be msgpack: only when Accept names a msgpack type."""
    return accept is not None and any(kind in accept for kind in MSGPACK_ACCEPT_TYPES)


def decode_data(body: bytes, content_type: str | None) -> Any:
    """The body as plain data; malformed bytes raise DecodeError."""
    return unpackb_whole(body) if is_msgpack_body(content_type) else loads_json(body)


def decode_request(body: bytes, content_type: str | None, cls: type[T]) -> T:
    """The body as a wire request message; a wrong field raises DecodeError naming its `$` path."""
    try:
        return structure(decode_data(body, content_type), cls)
    except DecodeError as exc:
        if exc.path == "$.items" and exc.message == _EMPTY_ITEMS:
            # The words sie-server 0.10.1 answers an empty batch with (contracts Part A §2.6).
            raise DecodeError("Field 'items' must not be empty") from exc
        raise


def render(body: Any, msgpack: bool) -> tuple[bytes, str]:
    """`(content, media_type)` of a whole response body."""
    if msgpack:
        return packb(body), MSGPACK_MEDIA_TYPE
    return dumps_json(body), JSON_MEDIA_TYPE
