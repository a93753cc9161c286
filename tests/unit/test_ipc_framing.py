"""IPC framing: `[u32 BE length][msgpack]`, empty frames, truncation and the frame cap (sie.ipc.framing)."""

import asyncio

import msgpack
import pytest

from sie.ipc.errors import IpcProtocolError
from sie.ipc.framing import MAX_FRAME_BYTES, FrameTooLargeError, encode_frame, read_frame, send_frames


def reader_of(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


class CollectingWriter:
    """Stands in for a StreamWriter: keeps what is written and counts drains."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.drains = 0

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        self.drains += 1


def test_the_exact_bytes_of_a_frame():
    body = msgpack.packb({"version": 1})
    assert body == b"\x81\xa7version\x01"
    assert encode_frame(body) == b"\x00\x00\x00\x0a\x81\xa7version\x01"


def test_the_frame_cap_is_32_mib():
    assert MAX_FRAME_BYTES == 32 * 1024 * 1024


async def test_frames_are_read_one_at_a_time_until_a_clean_end():
    reader = reader_of(encode_frame(b"\x81\xa1a\x01") + encode_frame(b"\x90"))
    assert await read_frame(reader) == b"\x81\xa1a\x01"
    assert await read_frame(reader) == b"\x90"
    assert await read_frame(reader) is None


async def test_a_zero_length_frame_is_an_empty_frame():
    reader = reader_of(b"\x00\x00\x00\x00" + encode_frame(b"\xc0"))
    assert await read_frame(reader) == b""
    assert await read_frame(reader) == b"\xc0"


async def test_a_frame_over_the_cap_is_refused_before_its_body_is_read():
    # Only the header arrives and no end of stream: the reader must not wait for 32 MiB + 1 bytes.
    reader = reader_of((MAX_FRAME_BYTES + 1).to_bytes(4, "big"), eof=False)
    with pytest.raises(FrameTooLargeError) as caught:
        await asyncio.wait_for(read_frame(reader), timeout=5)
    assert str(caught.value) == f"frame too large: {MAX_FRAME_BYTES + 1} > {MAX_FRAME_BYTES}"
    assert isinstance(caught.value, IpcProtocolError)


async def test_a_frame_at_the_cap_is_accepted():
    reader = reader_of(encode_frame(b"x" * 10), eof=True)
    assert await read_frame(reader, max_bytes=10) == b"x" * 10


async def test_a_smaller_cap_applies():
    with pytest.raises(FrameTooLargeError):
        await read_frame(reader_of(encode_frame(b"x" * 11)), max_bytes=10)


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"\x00\x00", "truncated frame header"), (b"\x00\x00\x00\x05ab", "truncated frame body: 2 of 5 bytes")],
)
async def test_truncated_frames_are_protocol_errors(data: bytes, message: str):
    with pytest.raises(IpcProtocolError) as caught:
        await read_frame(reader_of(data))
    assert str(caught.value) == message


async def test_send_frames_writes_small_and_large_frames_and_drains_after_each():
    writer = CollectingWriter()
    large = b"y" * (200 * 1024)
    await send_frames(writer, [b"\x01", large, b""])
    assert bytes(writer.data) == encode_frame(b"\x01") + encode_frame(large) + b"\x00\x00\x00\x00"
    assert writer.drains == 3
