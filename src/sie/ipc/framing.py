"""IPC framing: `[u32 big-endian length][msgpack body]` in both directions (contracts Part A §2.1).

Owns the header layout and the frame size check on read; what a frame means is the server's and client's business.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from typing import Final

from sie.ipc.errors import IpcProtocolError
from sie.wire.ipc import IPC_MAX_FRAME_BYTES

HEADER: Final = struct.Struct("!I")
# The legacy single-frame ceiling: a longer frame is a protocol error and closes the connection.
MAX_FRAME_BYTES: Final = IPC_MAX_FRAME_BYTES
# Below this size header and body go out as one bytes object; above it, two writes avoid copying the body.
_JOIN_BELOW_BYTES: Final = 64 * 1024


class FrameTooLargeError(IpcProtocolError):
    """A frame whose declared or actual length is over the limit."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame too large: {length} > {limit}")
        self.length = length
        self.limit = limit


def encode_frame(payload: bytes) -> bytes:
    """The frame carrying `payload`: its 4-byte big-endian length, then the payload itself."""
    return HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes | None:
    """Read one frame body; None on a clean end of stream, IpcProtocolError when truncated or over `max_bytes`.

    A length of 0 is an empty frame and comes back as b"".
    """
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise IpcProtocolError("truncated frame header") from exc
    (length,) = HEADER.unpack(header)
    if length > max_bytes:
        raise FrameTooLargeError(length, max_bytes)
    if length == 0:
        return b""
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise IpcProtocolError(f"truncated frame body: {len(exc.partial)} of {length} bytes") from exc


async def send_frames(writer: asyncio.StreamWriter, payloads: Iterable[bytes]) -> None:
    """Write each payload as one frame, draining after each so a chunked response never sits whole in the buffer.

    The caller serialises writers of one connection and translates OSError (peer gone).
    """
    for payload in payloads:
        if len(payload) < _JOIN_BELOW_BYTES:
            writer.write(HEADER.pack(len(payload)) + payload)
        else:
            writer.write(HEADER.pack(len(payload)))
            writer.write(payload)
        await writer.drain()
