"""The local-ingest wire protocol (seed 001 "Local Ingest"), without I/O: the frame header and its limit, the four
frame types, a submit's validation against the sidecar's lane, and the budgets a connection takes from. The
socket, the connections and settlement are `sie.sidecar.local_ingest`'s.

Frames are `[u32 big-endian length][msgpack map]` both ways (the worker IPC's framing), each map naming its `type`:

    server → client   {"type": "hello", "version": 1, "pool", "machine_profile", "bundle", "worker_id",
                       "max_frame_bytes", "max_inflight_items"}                       first, once
    client → server   {"type": "submit", "id", "items": [WorkItem wire map, …]}
    server → client   {"type": "result", "id", "index", "result": WorkResult wire map}   one per item, as each ends
    server → client   {"type": "error", "id", "code", "message"}                        a refused submit

An error whose `id` is "" concerns the connection (a frame over the limit, a malformed or duplicate frame, too many
connections): the server closes the connection after it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import attrs

from sie.ipc.framing import HEADER
from sie.ipc.framing import encode_frame as framed
from sie.transport.base import Lane
from sie.wire import DecodeError, codes, packb, structure, unpackb, unstructure
from sie.wire.queue import OPERATION_GENERATE, WorkItem, WorkResult

VERSION: Final = 1
HELLO: Final = "hello"
SUBMIT: Final = "submit"
RESULT: Final = "result"
ERROR: Final = "error"
CONNECTION_ID: Final = ""  # the `id` of an error about the connection rather than one submit
MAX_ID_CHARS: Final = 256


class ProtocolError(Exception):
    """A frame that breaks the protocol: answered with a connection error, then the connection is closed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SubmitRefused(Exception):
    """A well-framed submit the server will not run: answered with an error frame under its id."""

    def __init__(self, submit_id: str, code: str, message: str) -> None:
        super().__init__(message)
        self.submit_id = submit_id
        self.code = code
        self.message = message


@attrs.frozen
class SubmitFrame:
    """A submit's id and its items as sent (wire maps, not yet validated)."""

    id: str
    items: Any


def frame_length(header: bytes, max_frame_bytes: int) -> int:
    """The body length a frame header declares; ProtocolError (PAYLOAD_TOO_LARGE) when over `max_frame_bytes`."""
    (length,) = HEADER.unpack(header)
    if length > max_frame_bytes:
        raise ProtocolError(codes.PAYLOAD_TOO_LARGE, f"frame of {length} bytes, over the {max_frame_bytes}-byte limit")
    return length


def encode_frame(message: dict[str, Any]) -> bytes:
    """One frame: the header (the worker IPC's), then the message as msgpack."""
    return framed(packb(message))


def hello_frame(lane: Lane, worker_id: str, max_frame_bytes: int, max_inflight_items: int) -> bytes:
    return encode_frame({
        "type": HELLO, "version": VERSION, "pool": lane.pool, "machine_profile": lane.machine_profile,
        "bundle": lane.bundle, "worker_id": worker_id, "max_frame_bytes": max_frame_bytes,
        "max_inflight_items": max_inflight_items,
    })  # fmt: skip


def error_frame(submit_id: str, code: str, message: str) -> bytes:
    return encode_frame({"type": ERROR, "id": submit_id, "code": code, "message": message})


def result_frame(submit_id: str, index: int, result: WorkResult) -> bytes:
    """The frame of item `index` of a submit (its body packed here, once: it leaves the process)."""
    return encode_frame({"type": RESULT, "id": submit_id, "index": index, "result": unstructure(result)})


def read_submit(body: bytes) -> SubmitFrame:
    """The id and items of a submit frame; ProtocolError for anything else (not a msgpack map, another type, an id
    that is not a short non-empty string)."""
    try:
        message = unpackb(body)
    except DecodeError as exc:
        raise ProtocolError(codes.INVALID_INPUT, str(exc)) from exc
    if type(message) is not dict:
        raise ProtocolError(codes.INVALID_INPUT, f"a frame must be a map, got {type(message).__name__}")
    if message.get("type") != SUBMIT:
        raise ProtocolError(codes.INVALID_INPUT, f"unknown frame type {message.get('type')!r}; expected 'submit'")
    submit_id = message.get("id")
    if type(submit_id) is not str or not submit_id or len(submit_id) > MAX_ID_CHARS:
        raise ProtocolError(codes.INVALID_INPUT, f"a submit's id must be a string of 1-{MAX_ID_CHARS} characters")
    return SubmitFrame(submit_id, message.get("items"))


@attrs.frozen
class Addressing:
    """What the server writes into every item of one submit: its router id, and the reply subject prefix under which
    item `i` answers on `{reply_prefix}.{i}`."""

    router_id: str
    reply_prefix: str


def submit_items(submit: SubmitFrame, lane: Lane, max_items: int, addressing: Addressing) -> list[WorkItem]:
    """The submit's work items for this lane, addressed by the server, lane fields left empty taking the lane's;
    SubmitRefused (INVALID_INPUT) for a malformed list or item, another lane, no model, a generation, a payload
    reference or a repeated work item id."""
    raw_items = submit.items
    if type(raw_items) is not list or not raw_items:
        raise SubmitRefused(submit.id, codes.INVALID_INPUT, "'items' must be a non-empty list of work items")
    if len(raw_items) > max_items:
        message = f"{len(raw_items)} items, more than the {max_items} a connection may have in flight"
        raise SubmitRefused(submit.id, codes.INVALID_INPUT, message)
    items = [_lane_item(submit.id, index, raw, lane, addressing) for index, raw in enumerate(raw_items)]
    if len({item.work_item_id for item in items}) != len(items):
        raise SubmitRefused(submit.id, codes.INVALID_INPUT, "work_item_id repeats within the submit")
    return items


def _lane_item(submit_id: str, index: int, raw: Any, lane: Lane, addressing: Addressing) -> WorkItem:
    if type(raw) is not dict:
        raise SubmitRefused(submit_id, codes.INVALID_INPUT, f"item {index} must be a map")
    # The server's own fields: results go back to this connection only, and only our cancels apply.
    fields = {**raw, "reply_subject": f"{addressing.reply_prefix}.{index}", "router_id": addressing.router_id}
    for name, value in (("pool_name", lane.pool), ("machine_profile", lane.machine_profile)):
        given = fields.get(name) or ""
        if given not in ("", value):
            message = f"item {index} is for {name} {given!r}; this socket serves {value!r}"
            raise SubmitRefused(submit_id, codes.INVALID_INPUT, message)
        fields[name] = value
    try:
        item = structure(fields, WorkItem)
    except DecodeError as exc:
        raise SubmitRefused(submit_id, codes.INVALID_INPUT, f"item {index} is not a work item: {exc}") from exc
    if not item.model_id:
        raise SubmitRefused(submit_id, codes.INVALID_INPUT, f"item {index} names no model_id")
    if item.operation == OPERATION_GENERATE:
        message = f"item {index}: generation is not served over local ingest (encode, score and extract are)"
        raise SubmitRefused(submit_id, codes.INVALID_INPUT, message)
    if item.payload_ref is not None or item.query_payload_ref is not None:
        message = f"item {index} names a payload_ref; local ingest carries items inline"
        raise SubmitRefused(submit_id, codes.INVALID_INPUT, message)
    return item


class Budget:
    """A fixed amount (items, bytes) that a connection takes from and gives back: `try_take` refuses what does not
    fit now, `take` waits for it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    def try_take(self, amount: int) -> bool:
        if self.used + amount > self.limit:
            return False
        self.used += amount
        return True

    async def take(self, amount: int) -> None:
        """Wait until `amount` fits, then take it; ValueError when it never could."""
        if amount > self.limit:
            raise ValueError(f"{amount} is over the budget's limit of {self.limit}")
        while not self.try_take(amount):
            self._freed.clear()
            await self._freed.wait()

    def give(self, amount: int) -> None:
        self.used = max(0, self.used - amount)
        self._freed.set()


__all__ = [
    "CONNECTION_ID",
    "Addressing",
    "Budget",
    "ProtocolError",
    "SubmitFrame",
    "SubmitRefused",
    "encode_frame",
    "error_frame",
    "frame_length",
    "hello_frame",
    "read_submit",
    "result_frame",
    "submit_items",
]
