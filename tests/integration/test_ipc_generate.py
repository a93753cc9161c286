"""Streamed generation over a real Unix socket: the worker's IpcServer answers ProcessGenerate with one frame per
GenerateEvent, the sidecar's UdsWorkerClient yields them in order; errors, early exits, dropped connections,
idle streams, cancellation and Drain (sie.ipc.server, sie.ipc.uds_client).

The service behind the socket is scripted (support.ipc_fakes.FakeService): the socket is the subject here.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from sie.ipc.errors import IpcConnectionError, IpcRemoteError, IpcTimeoutError
from sie.ipc.server import IpcServer
from sie.ipc.uds_client import UdsWorkerClient
from sie.wire import unpackb
from sie.wire.generate import GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc import PROCESS_GENERATE, PROCESS_GENERATE_WITH_EXECUTION_AUTHORITY_V1
from sie.wire.ipc_batch import RunBatchItem, RunBatchRequest
from sie.wire.ipc_control import DrainRequest, PingRequest, SignalGenerateCancelRequest
from support.ipc_fakes import FakeService, generate_request
from support.polling import eventually


@pytest.fixture()
def socket_path():
    directory = tempfile.mkdtemp(prefix="sie-ipc-", dir="/tmp")
    yield Path(directory) / "worker.sock"
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture()
def service() -> FakeService:
    return FakeService()


def summary(events: list[GenerateEvent]) -> list[str]:
    """Each event as `kind` or `publish:<generation>/<seq>` (what the fake packed into the payload)."""
    out = []
    for event in events:
        if event.kind == "publish":
            chunk = unpackb(event.payload)
            out.append(f"publish:{chunk['request_id']}/{chunk['seq']}")
        else:
            out.append(event.kind)
    return out


def streams_of(client: UdsWorkerClient) -> tuple[dict, dict]:
    """The client connection's waiting calls and open streams."""
    connection = client._connection
    assert connection is not None
    return connection.pending, connection.streams


async def rest(events) -> list[GenerateEvent]:
    """What is left of a stream, to its end."""
    return [event async for event in events]


async def test_events_arrive_in_order_and_end_with_done(service, socket_path: Path):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        events = [event async for event in client.process_generate(generate_request("g1"))]
        assert streams_of(client) == ({}, {})
    assert summary(events) == ["publish:g1/0", "publish:g1/1", "publish:g1/2", "ack", "done"]
    assert {event.reply_subject for event in events[:3]} == {"_INBOX.g1"}
    assert service.generations == {"g1": "done"} and service.cancel_requests == []


async def test_two_generations_and_a_batch_interleave_on_one_connection(service, socket_path: Path):
    for name in ("g1", "g2"):
        service.generate_gates[name] = asyncio.Event()
    service.gates[7] = asyncio.Event()
    batch = RunBatchRequest(model_id="m", batch_id=7, lora_key="", total_cost=1,
                            items=[RunBatchItem(op="encode", work_item_id="w7", item_index=0)])  # fmt: skip
    async with IpcServer(service, socket_path) as server, UdsWorkerClient(socket_path) as client:
        first = client.process_generate(generate_request("g1"))
        second = client.process_generate(generate_request("g2"))
        head = [await anext(first), await anext(second)]  # both held after their first token
        running = asyncio.ensure_future(client.run_batch(batch))
        service.generate_gates["g2"].set()
        second_rest = await rest(second)  # g2 finishes while g1 and the batch are held
        assert not running.done()
        service.gates[7].set()
        outcome = await running  # the batch answers while g1 is still held
        service.generate_gates["g1"].set()
        first_rest = await rest(first)
        assert server.connection_count == 1 and streams_of(client) == ({}, {})
    assert summary(head) == ["publish:g1/0", "publish:g2/0"]
    assert summary(second_rest) == ["publish:g2/1", "publish:g2/2", "ack", "done"]
    assert summary(first_rest) == ["publish:g1/1", "publish:g1/2", "ack", "done"]
    assert [item.work_item_id for item in outcome.outcomes] == ["w7"]
    assert service.generations == {"g1": "done", "g2": "done"}


async def test_a_failure_in_the_services_iterator_ends_the_stream_with_a_remote_error(service, socket_path: Path):
    service.generate_failures["g1"] = 2
    received: list[GenerateEvent] = []
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcRemoteError) as caught:
            async for event in client.process_generate(generate_request("g1")):
                received.append(event)
        assert streams_of(client) == ({}, {})
        assert (await client.ping(PingRequest(timestamp_ms=1.0))).ready is True
    assert caught.value.message == "RuntimeError: decoding g1 failed"
    assert summary(received) == ["publish:g1/0", "publish:g1/1"]
    assert service.generations == {"g1": "failed"}
    assert service.cancel_requests == []  # the worker ended it: nothing to cancel


async def test_leaving_early_cancels_the_generation_and_drops_its_frames(service, socket_path: Path):
    service.generate_gates["g1"] = asyncio.Event()
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        events = client.process_generate(generate_request("g1"))
        assert summary([await anext(events)]) == ["publish:g1/0"]
        await events.aclose()
        assert service.cancel_requests == ["g1"]
        await eventually(lambda: service.generations.get("g1") == "cancelled", what="the generation to end")
        # Its ack and done came back to nobody: dropped, and the connection still serves.
        assert streams_of(client) == ({}, {})
        assert (await client.ping(PingRequest(timestamp_ms=2.0))).timestamp_ms == 2.0


async def test_a_dropped_connection_closes_the_servers_iterator(service, socket_path: Path):
    service.generate_gates["g1"] = asyncio.Event()
    async with IpcServer(service, socket_path) as server:
        async with UdsWorkerClient(socket_path) as client:
            events = client.process_generate(generate_request("g1"))
            await anext(events)
        await eventually(lambda: service.generations.get("g1") == "closed", what="the server to close the stream")
        with pytest.raises(IpcConnectionError):
            await anext(events)
        await eventually(lambda: server.connection_count == 0, what="the connection to go")
    assert service.cancel_requests == []  # nothing to cancel over a connection that is gone


class HeldEvents:
    """An async iterator that is no generator: one publish, then it waits until closed (only aclose stops it)."""

    def __init__(self) -> None:
        self.sent = False
        self.closed = asyncio.Event()

    def __aiter__(self) -> HeldEvents:
        return self

    async def __anext__(self) -> GenerateEvent:
        if not self.sent:
            self.sent = True
            return GenerateEvent(kind="publish", payload=b"x")
        await self.closed.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.closed.set()


class HeldService(FakeService):
    def __init__(self) -> None:
        super().__init__()
        self.held = HeldEvents()

    def process_generate(self, request: ProcessGenerateRequest) -> HeldEvents:
        return self.held


async def test_a_dropped_connection_closes_an_iterator_that_is_no_generator(socket_path: Path):
    service = HeldService()
    async with IpcServer(service, socket_path):
        async with UdsWorkerClient(socket_path) as client:
            events = client.process_generate(generate_request("g1"))
            assert (await anext(events)).payload == b"x"
        await asyncio.wait_for(service.held.closed.wait(), 5.0)
        await events.aclose()


async def test_closing_the_server_closes_its_streams(service, socket_path: Path):
    service.generate_gates["g1"] = asyncio.Event()
    async with UdsWorkerClient(socket_path) as client:
        async with IpcServer(service, socket_path):
            events = client.process_generate(generate_request("g1"))
            await anext(events)
        assert service.generations == {"g1": "closed"}
        with pytest.raises(IpcConnectionError):
            await anext(events)


async def test_a_silent_stream_times_out_and_is_cancelled(service, socket_path: Path):
    service.generate_gates["g1"] = asyncio.Event()
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path, stream_idle_s=0.2) as client:
        events = client.process_generate(generate_request("g1"))
        await anext(events)
        with pytest.raises(IpcTimeoutError, match="sent nothing for 0.2 s"):
            await anext(events)
        assert service.cancel_requests == ["g1"] and streams_of(client) == ({}, {})
        await eventually(lambda: service.generations.get("g1") == "cancelled", what="the generation to end")


async def test_signal_generate_cancel_round_trip(service, socket_path: Path):
    service.generate_gates["g1"] = asyncio.Event()
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        unknown = await client.signal_generate_cancel(SignalGenerateCancelRequest(request_id="nobody"))
        events = client.process_generate(generate_request("g1"))
        head = await anext(events)
        running = await client.signal_generate_cancel(SignalGenerateCancelRequest(request_id="g1"))
        tail = await rest(events)
    assert (unknown.matched, running.matched) == (False, True)
    assert summary([head, *tail]) == ["publish:g1/0", "ack", "done"]
    assert service.generations == {"g1": "cancelled"}


async def test_drain_refuses_a_new_generation(service, socket_path: Path):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        await client.drain(DrainRequest(deadline_ms=1000))
        with pytest.raises(IpcRemoteError, match="^draining$"):
            await anext(client.process_generate(generate_request("g1")))
        assert streams_of(client) == ({}, {})
    assert service.generations == {}


async def test_a_bad_body_and_the_execution_authority_variant_are_refused(service, socket_path: Path):
    async with IpcServer(service, socket_path), UdsWorkerClient(socket_path) as client:
        with pytest.raises(IpcRemoteError, match="^bad body for ProcessGenerate: .*work_item_msgpack"):
            await client.call(PROCESS_GENERATE, {"model_id": "m"}, GenerateEvent)
        request = generate_request("g1")
        with pytest.raises(IpcRemoteError, match="^unknown method ProcessGenerateWithExecutionAuthorityV1$"):
            await client.call(PROCESS_GENERATE_WITH_EXECUTION_AUTHORITY_V1, request, GenerateEvent)
    assert service.generations == {}
