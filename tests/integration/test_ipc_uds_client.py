"""The sidecar's IPC client over a real Unix socket: typed calls, errors, concurrency, chunk verification,
timeouts and reconnection (sie.ipc.uds_client).

The peers are our IpcServer over a fake service, or a scripted raw server that misbehaves on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from sie.ipc.chunking import ChunkBudget, ChunkLimits
from sie.ipc.errors import IpcConnectionError, IpcProtocolError, IpcRemoteError, IpcTimeoutError
from sie.ipc.framing import encode_frame, read_frame
from sie.ipc.server import IpcServer
from sie.ipc.uds_client import UdsWorkerClient
from sie.wire.ipc_batch import RunBatchItem, RunBatchRequest
from sie.wire.ipc_control import (
    ApplyModelConfigRequest,
    DrainRequest,
    EnsureModelReadyRequest,
    PingRequest,
    WorkerCapabilitiesRequest,
)
from support.ipc_fakes import FakeService

SMALL = ChunkLimits(max_frame_bytes=4096, max_payload_bytes=1024, max_chunks=8, max_total_bytes=8192)


# The same seams as the fake in test_ipc_server.py (test modules do not import each other).
def batch(batch_id: int, items: int = 1) -> RunBatchRequest:
    return RunBatchRequest(
        model_id="m", batch_id=batch_id, lora_key="", total_cost=items,
        items=[RunBatchItem(op="encode", work_item_id=f"w{batch_id}.{i}", item_index=i) for i in range(items)],
    )  # fmt: skip


@pytest.fixture()
def socket_path():
    directory = tempfile.mkdtemp(prefix="sie-ipc-", dir="/tmp")
    yield Path(directory) / "worker.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture()
def service() -> FakeService:
    return FakeService()


# --- a scripted peer ------------------------------------------------------------------------------

Script = Callable[[dict], list[bytes] | None]


def response(request_id: str, body=None, **fields) -> bytes:
    envelope = {"version": 1, "request_id": request_id, "ok": True, "body": body, "error": None} | fields
    return msgpack.packb(envelope, use_bin_type=True)


def chunked(request_id: str, envelope: bytes, size: int = 1024, digest: bytes | None = None) -> list[dict]:
    digest = hashlib.sha256(envelope).digest() if digest is None else digest
    pieces = [envelope[i : i + size] for i in range(0, len(envelope), size)]
    return [
        {"version": 1, "request_id": request_id, "transfer_digest": digest, "chunk_index": index,
         "chunk_count": len(pieces), "total_bytes": len(envelope), "payload": piece, "kind": "ipc_response_chunk_v1"}
        for index, piece in enumerate(pieces)
    ]  # fmt: skip


def packed(chunks: list[dict]) -> list[bytes]:
    return [msgpack.packb(chunk, use_bin_type=True) for chunk in chunks]


def drain_body(request_id: str, pad: int = 6000) -> bytes:
    """A Drain response envelope over SMALL's 4096-byte frame limit (padding in an unknown field)."""
    return response(request_id, {"acknowledged": True, "padding": b"p" * pad})


@contextlib.asynccontextmanager
async def scripted(socket_path: Path, script: Script):
    """A raw peer that answers each request frame with `script(request)`; None closes the connection."""
    seen: list[dict] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (frame := await read_frame(reader)) is not None:
                request = msgpack.unpackb(frame)
                seen.append(request)
                frames = script(request)
                if frames is None:
                    return
                for body in frames:
                    writer.write(encode_frame(body))
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_unix_server(handle, path=str(socket_path))
    try:
        yield seen
    finally:
        server.close()
        await server.wait_closed()


def ping_or(script: Script) -> Script:
    """Answer Ping normally, everything else with `script`."""

    def answer(request: dict) -> list[bytes] | None:
        if request["method"] == "Ping":
            return [response(request["request_id"], {"timestamp_ms": 1.0, "worker_id": "s"})]
        return script(request)

    return answer


# --- against our server -----------------------------------------------------------------------------


async def test_every_method_round_trips(service, socket_path: Path):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path, timeout_s=10) as client:
        ping = await client.ping(PingRequest(timestamp_ms=5.0))
        ready = await client.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))
        outcome = await client.run_batch(batch(1, items=3))
        capabilities = await client.worker_capabilities(WorkerCapabilitiesRequest())
        with pytest.raises(IpcRemoteError) as caught:
            await client.apply_model_config(
                ApplyModelConfigRequest(bundle_id="b", model_id="m", epoch=1, bundle_config_hash="h", model_config="")
            )
        drained = await client.drain(DrainRequest(deadline_ms=1000))
        with pytest.raises(IpcRemoteError, match="^draining$"):
            await client.run_batch(batch(2))
    assert (ping.worker_id, ping.timestamp_ms, ready.state) == ("fake", 5.0, "loading_started")
    assert [o.work_item_id for o in outcome.outcomes] == ["w1.0", "w1.1", "w1.2"]
    assert outcome.outcomes[0].result_msgpack.packed() == b"\x00\x01"
    assert capabilities.supported_models == ["m"] and drained.acknowledged is True
    assert caught.value.message == "RuntimeError: apply is not scripted"


async def test_a_handler_failure_is_a_remote_error(service, socket_path: Path):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcRemoteError, match="^RuntimeError: boom$"):
            await client.ensure_model_ready(EnsureModelReadyRequest(model_id="boom"))
        assert (await client.ping(PingRequest(timestamp_ms=1.0))).ready is True


async def test_concurrent_batches_share_one_connection_and_finish_out_of_order(service, socket_path: Path):
    service.gates[1] = asyncio.Event()
    async with IpcServer(service, socket_path) as server, UdsWorkerClient(socket_path) as client:
        slow = asyncio.ensure_future(client.run_batch(batch(1)))
        fast = asyncio.ensure_future(client.run_batch(batch(2)))
        done, _ = await asyncio.wait({slow, fast}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {fast} and not slow.done()
        assert server.connection_count == 1
        service.gates[1].set()
        assert (await slow).outcomes[0].work_item_id == "w1.0"


async def test_chunked_response_round_trip_with_small_limits(service, socket_path: Path):
    service.blob = os.urandom(5000)
    budget = ChunkBudget()
    async with (
        IpcServer(service, socket_path, limits=SMALL),
        UdsWorkerClient(socket_path, limits=SMALL, budget=budget) as client,
    ):
        outcome = await client.run_batch(batch(1))
    assert outcome.outcomes[0].result_msgpack.packed() == service.blob
    assert budget.used_bytes == 0  # released once the response was decoded


async def test_chunked_response_at_the_real_limits(service, socket_path: Path):
    service.blob = os.urandom(20 << 20)
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path, timeout_s=60) as client:
        started = time.perf_counter()
        outcome = await client.run_batch(batch(1, items=2))  # two 20 MiB blobs: a ~40 MiB response, 10 chunks
        elapsed = time.perf_counter() - started
    assert [o.result_msgpack.packed() == service.blob for o in outcome.outcomes] == [True, True]
    print(f"\n40 MiB chunked RunBatch response: {elapsed * 1000:.0f} ms")


# --- chunk verification against a scripted peer ----------------------------------------------------


def _digest_mismatch(request: dict) -> list[bytes]:
    chunks = chunked(request["request_id"], drain_body(request["request_id"]))
    chunks[2]["payload"] = b"x" * len(chunks[2]["payload"])
    return packed(chunks)


def _gap(request: dict) -> list[bytes]:
    chunks = chunked(request["request_id"], drain_body(request["request_id"]))
    return packed(chunks[:1] + chunks[2:])


def _inner_identity(request: dict) -> list[bytes]:
    # Chunks routed to this call, but the bytes hold another call's envelope.
    return packed(chunked(request["request_id"], drain_body("someone-else")))


def _layout_change(request: dict) -> list[bytes]:
    chunks = chunked(request["request_id"], drain_body(request["request_id"]))
    chunks[1]["chunk_count"] += 1
    return packed(chunks)


def _legacy_mid_transfer(request: dict) -> list[bytes]:
    chunks = chunked(request["request_id"], drain_body(request["request_id"]))
    return packed(chunks[:2]) + [response(request["request_id"], {"acknowledged": True})]


def _within_legacy_limit(request: dict) -> list[bytes]:
    return packed(chunked(request["request_id"], drain_body(request["request_id"], pad=100), size=64))


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (_digest_mismatch, "IPC response chunk digest is invalid"),
        (_gap, "IPC response chunk index 2 is duplicate or out of order (expected 1)"),
        (_inner_identity, "reassembled IPC response is not the response envelope of 'ipc-1'"),
        (_layout_change, "IPC response chunk layout changed during transfer"),
        (_legacy_mid_transfer, "IPC response changed from chunked to legacy mid-transfer"),
        (_within_legacy_limit, "IPC response chunk bounds are invalid"),
    ],
)
async def test_chunk_verification_failures_raise(socket_path: Path, script: Script, message: str):
    async with scripted(socket_path, ping_or(script)), UdsWorkerClient(socket_path, limits=SMALL) as client:
        with pytest.raises(IpcProtocolError) as caught:
            await client.drain(DrainRequest())
        # Only that call failed: the connection still carries the next one.
        assert (await client.ping(PingRequest(timestamp_ms=1.0))).worker_id == "s"
    assert caught.value.message == message


async def test_a_valid_scripted_transfer_decodes(socket_path: Path):
    def script(request: dict) -> list[bytes]:
        return packed(chunked(request["request_id"], drain_body(request["request_id"])))

    async with scripted(socket_path, script) as seen, UdsWorkerClient(socket_path, limits=SMALL) as client:
        assert (await client.drain(DrainRequest())).acknowledged is True
    assert seen[0] == {"version": 1, "request_id": "ipc-1", "method": "Drain", "body": {"deadline_ms": None},
                       "accepts_ipc_response_chunks_v1": True}  # fmt: skip


# --- failures of the connection ------------------------------------------------------------------


async def test_no_worker_is_a_connection_error(socket_path: Path):
    async with UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcConnectionError, match="cannot connect to the worker"):
            await client.ping(PingRequest(timestamp_ms=1.0))


async def test_a_dropped_connection_fails_pending_calls_and_the_next_call_reconnects(socket_path: Path):
    drops = iter([True])

    def script(request: dict) -> list[bytes] | None:
        if request["method"] == "Drain" and next(drops, False):
            return None  # close with the call pending
        return [response(request["request_id"], {"acknowledged": True})]

    async with scripted(socket_path, ping_or(script)), UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcConnectionError, match="closed the IPC connection"):
            await client.drain(DrainRequest())
        assert (await client.drain(DrainRequest())).acknowledged is True


async def test_an_unroutable_frame_closes_the_connection(socket_path: Path):
    def script(request: dict) -> list[bytes]:
        return [msgpack.packb(["not", "a", "map"])]

    async with scripted(socket_path, ping_or(script)), UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcConnectionError, match="IPC response must be a map"):
            await client.drain(DrainRequest())
        assert (await client.ping(PingRequest(timestamp_ms=1.0))).worker_id == "s"


async def test_a_malformed_body_is_a_protocol_error(socket_path: Path):
    def script(request: dict) -> list[bytes]:
        return [response(request["request_id"], {"acknowledged": "yes"})]

    async with scripted(socket_path, ping_or(script)), UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcProtocolError, match="bad response body for Drain: Expected `bool`, got `str`"):
            await client.drain(DrainRequest())


async def test_a_timeout_leaves_the_connection_usable(service, socket_path: Path):
    service.gates[1] = asyncio.Event()
    async with IpcServer(service, socket_path) as server, UdsWorkerClient(socket_path, timeout_s=0.2) as client:
        with pytest.raises(IpcTimeoutError, match="RunBatch got no answer from the worker within 0.2 s") as caught:
            await client.run_batch(batch(1))
        assert isinstance(caught.value, TimeoutError)
        service.gates[1].set()  # the late answer arrives and is dropped
        assert (await client.run_batch(batch(2))).outcomes[0].work_item_id == "w2.0"
        assert server.connection_count == 1


async def test_a_server_exit_fails_calls_in_flight(service, socket_path: Path):
    service.gates[1] = asyncio.Event()
    async with UdsWorkerClient(socket_path) as client:
        async with IpcServer(service, socket_path):
            pending = asyncio.ensure_future(client.run_batch(batch(1)))
            await client.ping(PingRequest(timestamp_ms=1.0))
        with pytest.raises(IpcConnectionError):
            await pending
        assert service.cancelled == [1]
        async with IpcServer(service, socket_path):
            assert (await client.ping(PingRequest(timestamp_ms=2.0))).timestamp_ms == 2.0


async def test_a_request_over_the_frame_limit_is_not_sent(service, socket_path: Path):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path, limits=SMALL) as client:
        with pytest.raises(IpcProtocolError, match="over the IPC frame limit"):
            await client.ensure_model_ready(EnsureModelReadyRequest(model_id="m" * 5000))


async def test_calls_need_the_context():
    with pytest.raises(IpcConnectionError, match="async with"):
        await UdsWorkerClient("/tmp/nowhere.sock").ping(PingRequest(timestamp_ms=1.0))
