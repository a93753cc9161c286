"""The fast request-id scan of seed 000 §16.2 step 4: read a WorkResult's `request_id` from its raw msgpack
bytes without decoding them, so a gateway drops results for requests it no longer waits for cheaply.

Pure bytes logic. WorkResult is a map whose first entries are `work_item_id` then `request_id` (field order),
so the scan walks those two entries exactly and otherwise looks for the key within the first SCAN_LIMIT bytes.
"""

from __future__ import annotations

_KEY = b"\xaarequest_id"  # fixstr of length 10, then the key
_FIRST_KEY = b"\xacwork_item_id"  # fixstr of length 12
_FIXMAP_MIN, _FIXMAP_MAX, _MAP16, _MAP32 = 0x80, 0x8F, 0xDE, 0xDF
_FIXSTR_MIN, _FIXSTR_MAX = 0xA0, 0xBF
# str 8/16/32: header byte -> width of the big-endian length that follows
_STR_LENGTH_WIDTH = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_MAP_HEADER_SIZE = {_MAP16: 3, _MAP32: 5}
# The key sits right after work_item_id; a wider scan would only find look-alikes inside payload bytes.
SCAN_LIMIT = 1024


def peek_request_id(data: bytes) -> str | None:
    """The `request_id` string of a msgpack WorkResult map, or None when it cannot be found cheaply.

    None means "decode it to know", never "unknown request": callers fall back to a full decode."""
    position = _after_first_entry(data)
    if position < 0 or not data.startswith(_KEY, position):
        position = data.find(_KEY, 0, SCAN_LIMIT)
        if position < 0:
            return None
    return _read_str(data, position + len(_KEY))[0]


def _after_first_entry(data: bytes) -> int:
    """Offset just past the leading `work_item_id` entry of a map, or -1 for another layout."""
    if not data:
        return -1
    head = data[0]
    start = 1 if _FIXMAP_MIN <= head <= _FIXMAP_MAX else _MAP_HEADER_SIZE.get(head, 0)
    if not start or not data.startswith(_FIRST_KEY, start):
        return -1
    return _read_str(data, start + len(_FIRST_KEY))[1]


def _read_str(data: bytes, position: int) -> tuple[str | None, int]:
    """The msgpack str at `position` and the offset after it; (None, -1) if it is not a whole valid str."""
    if position >= len(data):
        return None, -1
    head = data[position]
    if _FIXSTR_MIN <= head <= _FIXSTR_MAX:
        length, start = head & 0x1F, position + 1
    else:
        width = _STR_LENGTH_WIDTH.get(head)
        if width is None:
            return None, -1
        start = position + 1 + width
        length = int.from_bytes(data[position + 1 : start], "big")
    end = start + length
    if end > len(data):
        return None, -1
    try:
        return data[start:end].decode(), end
    except UnicodeDecodeError:
        return None, -1
