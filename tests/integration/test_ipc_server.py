"""The IPC server over a real Unix socket, spoken to with raw frames: the socket file (a stale one replaced, anything
else at the path refused, its directory this user's), envelope error strings, concurrent batches on one connection,
chunking negotiation and shutdown (sie.ipc.server).

The service behind it is a small fake: the server is what these tests are about.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

import msgpack
import pytest

from sie.ipc.chunking import NOT_NEGOTIATED, OVER_BOUNDS, ChunkLimits
from sie.ipc.framing import encode_frame
from sie.ipc.server import IpcServer
from sie.ipc.sockets import SocketPathError
from support.ipc_fakes import FakeService

NOBODY_UID = 65534
SMALL = ChunkLimits(max_frame_bytes=4096, max_payload_bytes=1024, max_chunks=8, max_total_bytes=8192)


class RawClient:
    """Frames in, frames out, with the reference msgpack library rather than our codec."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, message, **fields) -> None:
        if isinstance(message, str):
            message = {"version": 1, "request_id": fields.pop("request_id", "ipc-7"), "method": message} | fields
        await self.send_bytes(encode_frame(msgpack.packb(message, use_bin_type=True)))

    async def recv(self, timeout_s: float = 10.0) -> dict | None:
        """The next response map, or None when the server closed the connection."""
        try:
            header = await asyncio.wait_for(self.reader.readexactly(4), timeout_s)
        except asyncio.IncompleteReadError:
            return None
        body = await asyncio.wait_for(self.reader.readexactly(int.from_bytes(header, "big")), timeout_s)
        return msgpack.unpackb(body, raw=False)

    async def call(self, method: str, body: dict, **fields) -> dict:
        await self.send(method, body=body, **fields)
        return await self.recv()


def batch_body(batch_id: int, items: int = 1) -> dict:
    return {
        "model_id": "m", "batch_id": batch_id, "lora_key": "", "total_cost": items,
        "items": [{"op": "encode", "work_item_id": f"w{batch_id}.{i}", "request_id": "w", "item_index": i}
                  for i in range(items)],
    }  # fmt: skip


@pytest.fixture()
def socket_path():
    # AF_UNIX paths are limited to ~108 bytes; pytest's tmp_path can be longer.
    directory = tempfile.mkdtemp(prefix="sie-ipc-", dir="/tmp")
    yield Path(directory) / "worker.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture()
def service() -> FakeService:
    return FakeService()


@contextlib.asynccontextmanager
async def serving(service, socket_path: Path, **options):
    async with IpcServer(service, socket_path, worker_id="w-test", **options) as server:
        yield server


@contextlib.asynccontextmanager
async def raw_client(socket_path: Path):
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    try:
        yield RawClient(reader, writer)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


# --- the socket file ------------------------------------------------------------------------------


def socket_mode(path: Path) -> int | None:
    """The permission bits of the socket at `path`, None when there is no socket (sync: a test helper)."""
    if not path.is_socket():
        return None
    return stat.S_IMODE(path.stat().st_mode)


def entry_exists(path: Path) -> bool:
    return os.path.lexists(path)


def make_regular_file(path: Path) -> None:
    path.write_text("not a socket")


def make_directory(path: Path, mode: int = 0o700) -> None:
    path.mkdir(mode=mode)


def make_link(link: Path, target: Path) -> None:
    link.symlink_to(target)


def entry_kind(path: Path) -> str | None:
    """What is at `path` itself (a link is not followed), None when nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    kinds = {stat.S_ISDIR: "directory", stat.S_ISLNK: "link", stat.S_ISSOCK: "socket", stat.S_ISREG: "file"}
    return next(kind for test, kind in kinds.items() if test(mode))


def owner_and_mode(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_uid, stat.S_IMODE(info.st_mode)


def make_stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))


async def test_the_socket_is_0600_and_removed_on_exit(service, socket_path: Path):
    async with serving(service, socket_path):
        assert socket_mode(socket_path) == 0o600
    assert not entry_exists(socket_path)


async def test_a_stale_socket_is_replaced(service, socket_path: Path):
    make_stale_socket(socket_path)
    assert socket_mode(socket_path) is not None
    async with serving(service, socket_path), raw_client(socket_path) as client:
        assert (await client.call("Ping", {"timestamp_ms": 1.0}))["ok"] is True
        assert socket_mode(socket_path) == 0o600


async def test_a_regular_file_at_the_path_is_not_deleted(service, socket_path: Path):
    make_regular_file(socket_path)
    with pytest.raises(SocketPathError, match=re.escape(f"{socket_path} exists and is a regular file, not a socket")):
        async with serving(service, socket_path):
            pass
    assert entry_exists(socket_path) and socket_mode(socket_path) is None


async def test_a_directory_or_a_link_at_the_path_is_refused(service, socket_path: Path):
    make_directory(socket_path)
    with pytest.raises(SocketPathError, match=re.escape(f"{socket_path} exists and is a directory")):
        async with serving(service, socket_path):
            pass
    elsewhere = socket_path.with_name("elsewhere.sock")
    make_stale_socket(elsewhere)
    linked = socket_path.with_name("linked.sock")
    make_link(linked, elsewhere)
    with pytest.raises(SocketPathError, match=re.escape(f"{linked} exists and is a symbolic link")):
        async with serving(service, linked):
            pass
    assert [entry_kind(path) for path in (socket_path, linked, elsewhere)] == ["directory", "link", "socket"]


async def test_a_socket_another_server_listens_on_is_not_taken_over(service, socket_path: Path):
    async with serving(FakeService(), socket_path), raw_client(socket_path) as first:
        with pytest.raises(SocketPathError, match=re.escape(f"another process is listening on {socket_path}")):
            async with serving(service, socket_path):
                pass
        # The first server still owns the path and answers on it.
        assert (await first.call("Ping", {"timestamp_ms": 1.0}))["ok"] is True
        async with raw_client(socket_path) as second:
            assert (await second.call("Ping", {"timestamp_ms": 2.0}))["ok"] is True


async def test_a_missing_directory_is_created_for_this_user_only(service, socket_path: Path):
    nested = socket_path.parent / "run" / "worker.sock"
    async with serving(service, nested), raw_client(nested) as client:
        assert (await client.call("Ping", {"timestamp_ms": 1.0}))["ok"] is True
        assert owner_and_mode(nested.parent) == (os.getuid(), 0o700)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user takes root")
async def test_a_directory_of_another_user_is_refused(service, socket_path: Path):
    theirs = socket_path.parent / "theirs"
    make_directory(theirs, 0o777)
    os.chown(theirs, NOBODY_UID, NOBODY_UID)
    with pytest.raises(SocketPathError, match=re.escape(f"{theirs} belongs to uid {NOBODY_UID}, not to this user")):
        async with serving(service, theirs / "worker.sock"):
            pass
    assert entry_kind(theirs / "worker.sock") is None


# --- envelopes and error strings ------------------------------------------------------------------


async def test_ping_answer_is_the_plain_response_envelope(service, socket_path: Path):
    async with serving(service, socket_path), raw_client(socket_path) as client:
        answer = await client.call("Ping", {"timestamp_ms": 12.5})
    assert answer == {
        "version": 1, "request_id": "ipc-7", "ok": True, "error": None,
        "body": {"timestamp_ms": 12.5, "worker_id": "fake", "ready": True, "bundle_config_hash": "",
                 "loaded_models": [], "loading_models": []},
    }  # fmt: skip
    assert "kind" not in answer


@pytest.mark.parametrize(
    ("message", "request_id", "error"),
    [
        ({"version": 2, "request_id": "ipc-7", "method": "Ping", "body": {}}, "ipc-7", "unsupported version 2"),
        ({"request_id": "ipc-7", "method": "Ping", "body": {}}, "ipc-7", "unsupported version None"),
        ({"version": 1, "request_id": "ipc-7", "method": 4, "body": {}}, "ipc-7", "envelope missing fields"),
        ({"version": 1, "request_id": 17, "method": "Ping", "body": {}}, "", "envelope missing fields"),
        ({"version": 1, "request_id": "ipc-7", "method": "Ping", "body": [1]}, "ipc-7", "envelope missing fields"),
        ({"version": 1, "request_id": "ipc-7", "method": "NoSuchMethod", "body": {}}, "ipc-7",
         "unknown method NoSuchMethod"),
        ({"version": 1, "request_id": "ipc-7", "method": "ProcessEncodeBatch", "body": {"model_id": "m"}}, "ipc-7",
         "bad body for ProcessEncodeBatch: Object missing required field `items`"),
        ({"version": 1, "request_id": "ipc-7", "method": "Ping", "body": {"timestamp_ms": "now"}}, "ipc-7",
         "bad body for Ping: Expected `float`, got `str` - at `$.timestamp_ms`"),
        ({"version": 1, "request_id": "ipc-7", "method": "EnsureModelReady", "body": {"model_id": "boom"}}, "ipc-7",
         "RuntimeError: boom"),
        ({"version": 1, "request_id": "ipc-7", "method": "ApplyModelConfig",
          "body": {"bundle_id": "b", "model_id": "m", "epoch": 1, "bundle_config_hash": "h", "model_config": ""}},
         "ipc-7", "RuntimeError: apply is not scripted"),
    ],
)  # fmt: skip
async def test_error_responses(service, socket_path: Path, message: dict, request_id: str, error: str):
    async with serving(service, socket_path), raw_client(socket_path) as client:
        await client.send(message)
        answer = await client.recv()
        # The connection stays open after an error response.
        assert (await client.call("Ping", {"timestamp_ms": 1.0}))["ok"] is True
    assert answer == {"version": 1, "request_id": request_id, "ok": False, "body": None, "error": error}


@pytest.mark.parametrize(
    "data",
    [
        encode_frame(msgpack.packb([1, "Ping"])),  # not a map
        encode_frame(b"\xc1\x00"),  # malformed msgpack
        b"\x00\x00\x00\x00",  # an empty frame is no map either
        (32 * 1024 * 1024 + 1).to_bytes(4, "big"),  # over the frame cap: closed before the body
    ],
)
async def test_protocol_errors_close_the_connection_but_not_the_server(service, socket_path: Path, data: bytes):
    async with serving(service, socket_path):
        async with raw_client(socket_path) as client:
            await client.send_bytes(data)
            assert await client.recv() is None
        async with raw_client(socket_path) as client:
            assert (await client.call("Ping", {"timestamp_ms": 1.0}))["ok"] is True


async def test_batches_answer_draining_after_drain(service, socket_path: Path):
    async with serving(service, socket_path), raw_client(socket_path) as client:
        assert (await client.call("RunBatch", batch_body(1)))["ok"] is True
        assert await client.call("Drain", {"deadline_ms": 5000}) == {
            "version": 1, "request_id": "ipc-7", "ok": True, "body": {"acknowledged": True}, "error": None,
        }  # fmt: skip
        assert (await client.call("RunBatch", batch_body(2)))["error"] == "draining"
        assert (await client.call("Ping", {"timestamp_ms": 1.0}))["ok"] is True
    assert [batch.batch_id for batch in service.batches] == [1]


async def test_bytes_go_out_as_msgpack_bin(service, socket_path: Path):
    async with serving(service, socket_path), raw_client(socket_path) as client:
        answer = await client.call("RunBatch", batch_body(1))
    assert answer["body"]["outcomes"][0]["result_msgpack"] == b"\x00\x01"  # bytes, so bin, with raw=False


async def test_process_encode_batch_runs_as_one_run_batch(service, socket_path: Path):
    item = {"work_item_id": "r.0", "request_id": "r", "item_index": 0, "total_items": 1, "timestamp": 1.0,
            "item": {"text": "hi"}}  # fmt: skip
    async with serving(service, socket_path), raw_client(socket_path) as client:
        answer = await client.call("ProcessEncodeBatch", {"model_id": "m", "items": [item]})
    assert answer["ok"] is True and answer["body"]["outcomes"][0]["work_item_id"] == "r.0"
    (batch,) = service.batches
    assert (batch.model_id, batch.items[0].op, batch.items[0].encode.item) == ("m", "encode", {"text": "hi"})


# --- concurrency ------------------------------------------------------------------------------------


async def test_two_batches_on_one_connection_are_answered_out_of_order(service, socket_path: Path):
    service.gates[1] = asyncio.Event()
    async with serving(service, socket_path), raw_client(socket_path) as client:
        await client.send("RunBatch", request_id="slow", body=batch_body(1))
        await client.send("RunBatch", request_id="fast", body=batch_body(2))
        first = await client.recv()
        # Inline methods are answered while a batch is in flight.
        ping = await client.call("Ping", {"timestamp_ms": 3.0}, request_id="ping")
        service.gates[1].set()
        second = await client.recv()
    assert (first["request_id"], ping["request_id"], second["request_id"]) == ("fast", "ping", "slow")
    assert second["body"]["outcomes"][0]["work_item_id"] == "w1.0"


async def test_many_connections_at_once(service, socket_path: Path):
    async def one(index: int) -> str:
        async with raw_client(socket_path) as client:
            return (await client.call("RunBatch", batch_body(index), request_id=f"c{index}"))["request_id"]

    async with serving(service, socket_path):
        assert await asyncio.gather(*(one(i) for i in range(50))) == [f"c{i}" for i in range(50)]


async def test_a_full_connection_stops_being_read(service, socket_path: Path):
    service.gates[1] = asyncio.Event()
    async with serving(service, socket_path, max_in_flight=2), raw_client(socket_path) as client:
        for name in ("a", "b", "c"):
            await client.send("RunBatch", request_id=name, body=batch_body(1))
        await client.send("Ping", request_id="p", body={"timestamp_ms": 1.0})
        with pytest.raises(TimeoutError):
            await client.recv(timeout_s=0.3)  # two batches hold both slots: "c" and the ping wait unread
        service.gates[1].set()
        answers = [await client.recv() for _ in range(4)]
    assert sorted(answer["request_id"] for answer in answers) == ["a", "b", "c", "p"]


async def test_exit_cancels_batches_in_flight_and_closes_connections(service, socket_path: Path, caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    service.gates[1] = asyncio.Event()
    server = IpcServer(service, socket_path)
    async with server:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        client = RawClient(reader, writer)
        await client.send("RunBatch", request_id="held", body=batch_body(1))
        await client.call("Ping", {"timestamp_ms": 1.0})  # answered after the batch was read and started
        assert server.connection_count == 1
    # The client is still connected, but the server has gone: the batch was cancelled, not left running.
    assert service.cancelled == [1]
    assert await client.recv() is None
    writer.close()
    # Cancelling a connection must not surface as "Exception in callback" from asyncio's stream machinery.
    assert not [record for record in caplog.records if record.name == "asyncio"]


# --- response chunking --------------------------------------------------------------------------


async def test_a_large_response_is_refused_without_the_capability(service, socket_path: Path):
    service.blob = b"b" * 5000
    async with serving(service, socket_path, limits=SMALL), raw_client(socket_path) as client:
        plain = await client.call("RunBatch", batch_body(1))
        not_true = await client.call("RunBatch", batch_body(2), accepts_ipc_response_chunks_v1=1)
    assert plain == {"version": 1, "request_id": "ipc-7", "ok": False, "body": None, "error": NOT_NEGOTIATED}
    assert not_true["error"] == NOT_NEGOTIATED


async def test_a_response_over_the_chunking_bounds_is_refused(service, socket_path: Path):
    service.blob = b"b" * 9000
    async with serving(service, socket_path, limits=SMALL), raw_client(socket_path) as client:
        answer = await client.call("RunBatch", batch_body(1), accepts_ipc_response_chunks_v1=True)
    assert answer["error"] == OVER_BOUNDS


async def test_chunks_carry_the_exact_legacy_frame_bytes(service, socket_path: Path):
    service.blob = os.urandom(5000)
    async with serving(service, socket_path, limits=SMALL), raw_client(socket_path) as client:
        await client.send("RunBatch", body=batch_body(1), accepts_ipc_response_chunks_v1=True)
        first = await client.recv()
        chunks = [first] + [await client.recv() for _ in range(first["chunk_count"] - 1)]
        after = await client.call("Ping", {"timestamp_ms": 1.0})
    assert [chunk["chunk_index"] for chunk in chunks] == list(range(len(chunks)))
    assert {chunk["kind"] for chunk in chunks} == {"ipc_response_chunk_v1"}
    whole = b"".join(chunk["payload"] for chunk in chunks)
    assert len(whole) == first["total_bytes"] > SMALL.max_frame_bytes
    envelope = msgpack.unpackb(whole, raw=False)
    assert (envelope["request_id"], envelope["ok"]) == ("ipc-7", True)
    assert envelope["body"]["outcomes"][0]["result_msgpack"] == service.blob
    assert after["ok"] is True
