"""Local ingest (seed 001 "Local Ingest"), through its public surfaces: `sie run --role all` with
SIE_LOCAL_INGEST_SOCKET serving MiniLM, driven with `LocalIngestClient` and with raw frames; and the `LocalIngest`
server on its own, a test standing in for the pipeline's consumer stage (fetch, then ack or nak), for what the
pipeline never does on cue (redelivery up to max_deliver, a result over the frame limit, shutting down).

Sockets live in a short directory under /tmp: a Unix socket path is at most about 100 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import pytest

from launcher import serving_all, serving_cluster
from sie.client import LocalIngestClient, RequestError, ServerError, SIEConnectionError
from sie.ipc.sockets import SocketPathError
from sie.sidecar.local_ingest import LocalIngest, LocalIngestConfig, LocalResultBus
from sie.telemetry.metrics import Telemetry
from sie.telemetry.sidecar import SidecarMetrics
from sie.transport.base import Lane
from sie.wire import codes, packb, unpackb
from sie.wire.payload import ResultBody
from sie.wire.queue import GenerateParams, WorkItem, WorkResult
from support.polling import eventually
from support.prometheus import counts_by

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = ["Hello world", "The capital of France is Paris", "Local ingest skips HTTP"]
MAX_INFLIGHT = 8
MAX_FRAME = 64 * 1024
LANE = Lane("default", "default", "default")


@pytest.fixture(scope="module")
def short_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="sie-li-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def server(short_dir: Path) -> Iterator[tuple[str, Path]]:
    """`sie run --role all` serving MiniLM, with a local-ingest socket of small bounds: (base URL, socket)."""
    socket_path = short_dir / "all.sock"
    env = {"SIE_LOCAL_INGEST_SOCKET": str(socket_path), "SIE_LOCAL_INGEST_MAX_INFLIGHT_ITEMS": str(MAX_INFLIGHT),
           "SIE_LOCAL_INGEST_MAX_FRAME_BYTES": str(MAX_FRAME)}  # fmt: skip
    with serving_all(short_dir / "all.log", ["--preload", MINILM], env) as url:
        yield url, socket_path


@pytest.fixture(scope="module")
def cluster(short_dir: Path) -> Iterator[tuple[str, Path]]:
    """nats-server, worker, sidecar (with a local-ingest socket) and gateway: (gateway URL, socket)."""
    socket_path = short_dir / "sidecar.sock"
    with serving_cluster(short_dir / "c", pair_env={1: {"SIE_LOCAL_INGEST_SOCKET": str(socket_path)}}) as deployment:
        yield deployment.url, socket_path


# --- raw frames, for what the client never sends ---------------------------------------------------


async def raw_connection(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]]:
    reader, writer = await asyncio.open_unix_connection(str(path))
    hello = await read_message(reader)
    assert hello is not None and hello["type"] == "hello"
    return reader, writer, hello


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    async with asyncio.timeout(30):
        try:
            header = await reader.readexactly(4)
        except asyncio.IncompleteReadError:
            return None
        return unpackb(await reader.readexactly(int.from_bytes(header, "big")))


async def messages_until_closed(reader: asyncio.StreamReader) -> list[dict[str, Any]]:
    messages = []
    for _ in range(100):  # bounded: a submit of a few items, then the error
        message = await read_message(reader)
        if message is None:
            return messages
        messages.append(message)
    raise AssertionError(f"the connection stayed open after {messages[-3:]}")


def frame(message: dict[str, Any]) -> bytes:
    body = packb(message)
    return len(body).to_bytes(4, "big") + body


def encode_item(index: int, request_id: str = "raw", **fields: Any) -> dict[str, Any]:
    item = {"work_item_id": f"{request_id}.{index}", "request_id": request_id, "item_index": index,
            "total_items": 1, "operation": "encode", "model_id": MINILM, "profile_id": "default",
            "timestamp": time.time(), "item": {"text": f"text {index}"}, "output_types": ["dense"]}  # fmt: skip
    item.update(fields)
    return item


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


# --- the all role ------------------------------------------------------------------------------------


async def test_the_socket_is_owner_only_and_says_hello(server: tuple[str, Path]) -> None:
    _, path = server
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    async with LocalIngestClient(path) as client:
        hello = client.hello
    assert hello["type"] == "hello" and hello["version"] == 1
    assert (hello["pool"], hello["machine_profile"], hello["bundle"]) == ("default", "default", "default")
    assert hello["max_frame_bytes"] == MAX_FRAME and hello["max_inflight_items"] == MAX_INFLIGHT
    assert isinstance(hello["worker_id"], str) and hello["worker_id"]


async def test_encode_over_the_socket_equals_encode_over_http(server: tuple[str, Path]) -> None:
    url, path = server
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        answer = await http.post(f"/v1/encode/{MINILM}", json={"items": [{"text": text} for text in TEXTS]})
    assert answer.status_code == 200, answer.text
    over_http = [np.asarray(item["dense"]["values"], dtype=np.float32) for item in answer.json()["items"]]
    async with LocalIngestClient(path) as client:
        results = await client.encode(MINILM, TEXTS)
    assert [result.item_index for result in results] == [0, 1, 2]
    assert all(result.success for result in results), [result.error for result in results]
    for result, expected in zip(results, over_http, strict=True):
        assert result.result_msgpack is not None
        values = result.result_msgpack.value["dense"]["values"]
        assert values.shape == (384,)
        np.testing.assert_allclose(values, expected, atol=1e-6)


async def test_a_distributed_sidecar_serves_its_socket_beside_the_broker(cluster: tuple[str, Path]) -> None:
    url, path = cluster
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        answer = await http.post(f"/v1/encode/{MINILM}", json={"items": [{"text": text} for text in TEXTS]})
    assert answer.status_code == 200, answer.text
    async with LocalIngestClient(path) as client:
        assert client.hello["worker_id"] == "w-1"
        results = await client.encode(MINILM, TEXTS)
    for result, over_http in zip(results, answer.json()["items"], strict=True):
        assert result.success and result.result_msgpack is not None, result.error
        np.testing.assert_allclose(result.result_msgpack.value["dense"]["values"], over_http["dense"]["values"],
                                   atol=1e-6)  # fmt: skip


async def test_items_of_another_lane_and_generations_are_refused(server: tuple[str, Path]) -> None:
    _, path = server
    async with LocalIngestClient(path) as client:
        [item] = await _items(client, ["x"])
        with pytest.raises(RequestError) as caught:
            await client.submit([attrs.evolve(item, pool_name="elsewhere")])
        assert caught.value.code == codes.INVALID_INPUT and "elsewhere" in caught.value.message
        with pytest.raises(RequestError) as caught:
            await client.submit([attrs.evolve(item, machine_profile="h100")])
        assert caught.value.code == codes.INVALID_INPUT and "h100" in caught.value.message
        with pytest.raises(RequestError) as caught:
            await client.submit(
                [attrs.evolve(item, operation="generate", item=None, generate=GenerateParams(prompt="Paris is"))]
            )
        assert caught.value.code == codes.INVALID_INPUT and "generation" in caught.value.message
        [result] = await client.submit([item])  # the connection still serves
    assert result.success


async def test_a_frame_over_the_limit_closes_the_connection_unread(server: tuple[str, Path]) -> None:
    _, path = server
    reader, writer, _ = await raw_connection(path)
    writer.write((MAX_FRAME + 1).to_bytes(4, "big"))  # the body is never sent: the header alone is refused
    await writer.drain()
    messages = await messages_until_closed(reader)
    await close(writer)
    assert [(m["type"], m["id"], m["code"]) for m in messages] == [("error", "", codes.PAYLOAD_TOO_LARGE)]


async def test_a_duplicate_id_in_flight_closes_the_connection(server: tuple[str, Path]) -> None:
    _, path = server
    reader, writer, _ = await raw_connection(path)
    first = frame({"type": "submit", "id": "same", "items": [encode_item(i, total_items=4) for i in range(4)]})
    second = frame({"type": "submit", "id": "same", "items": [encode_item(0, request_id="other")]})
    writer.write(first + second)
    await writer.drain()
    messages = await messages_until_closed(reader)
    await close(writer)
    errors = [message for message in messages if message["type"] == "error"]
    assert len(errors) == 1 and errors[0]["id"] == "" and errors[0]["code"] == codes.INVALID_INPUT
    assert "already in flight" in errors[0]["message"]
    assert all(message["id"] == "same" for message in messages if message["type"] == "result")


async def test_submits_over_the_inflight_budget_are_refused_and_nothing_is_lost(server: tuple[str, Path]) -> None:
    _, path = server
    async with LocalIngestClient(path) as client:
        batches = [await _items(client, [f"burst {n}.{i}" for i in range(3)]) for n in range(12)]
        outcomes = await asyncio.gather(*(client.submit(batch) for batch in batches), return_exceptions=True)
        served = [outcome for outcome in outcomes if isinstance(outcome, list)]
        refused = [outcome for outcome in outcomes if not isinstance(outcome, list)]
        assert served and refused, outcomes
        assert all(isinstance(error, ServerError) and error.code == codes.QUEUE_FULL for error in refused), refused
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, list):
                assert [r.work_item_id for r in outcome] == [item.work_item_id for item in batch]
                assert all(result.success for result in outcome)
        with pytest.raises(RequestError) as caught:  # more than a connection may ever have in flight
            await client.submit(await _items(client, ["too many"] * (MAX_INFLIGHT + 1)))
        assert caught.value.code == codes.INVALID_INPUT
        assert all(result.success for result in await client.submit(batches[0]))  # room again


async def test_a_client_that_leaves_mid_flight_does_not_stop_the_next(server: tuple[str, Path]) -> None:
    _, path = server
    for _ in range(3):
        reader, writer, _ = await raw_connection(path)
        items = [encode_item(i, request_id="gone", total_items=MAX_INFLIGHT) for i in range(MAX_INFLIGHT)]
        writer.write(frame({"type": "submit", "id": "gone", "items": items}))
        await writer.drain()
        writer.transport.abort()  # gone without reading a single result
        await asyncio.sleep(0)
    async with LocalIngestClient(path) as client:
        results = await client.encode(MINILM, TEXTS)
    assert all(result.success for result in results)


async def _items(client: LocalIngestClient, texts: list[str]) -> list[WorkItem]:
    """The work items `client.encode` would send, built the same way."""
    now = time.time()
    request_id = f"t{time.monotonic_ns()}"
    return [
        WorkItem(work_item_id=f"{request_id}.{i}", request_id=request_id, item_index=i, total_items=len(texts),
                 operation="encode", model_id=MINILM, profile_id="default", pool_name="", machine_profile="",
                 router_id="", reply_subject="", timestamp=now, item={"text": text}, output_types=["dense"])
        for i, text in enumerate(texts)
    ]  # fmt: skip


# --- the server on its own ----------------------------------------------------------------------------


def config(path: Path, **fields: Any) -> LocalIngestConfig:
    return LocalIngestConfig(path, **{"max_frame_bytes": MAX_FRAME, "max_inflight_items": MAX_INFLIGHT, **fields})


@pytest.fixture()
async def ingest_path(short_dir: Path) -> AsyncIterator[Path]:
    path = short_dir / f"s{time.monotonic_ns() % 10**9}.sock"
    yield path
    path.unlink(missing_ok=True)


async def test_a_nak_redelivers_until_max_deliver_then_the_item_is_answered(ingest_path: Path) -> None:
    async with (
        LocalIngest(config(ingest_path, max_deliver=3), LANE, "w-1") as ingest,
        LocalIngestClient(ingest_path) as client,
    ):
        submitted = asyncio.get_running_loop().create_task(client.submit(await _items(client, ["x"])))
        for delivery_number, delay_s in ((1, 0.01), (2, 0.0), (3, 0.0)):
            [delivery] = await ingest.fetch(8, 5.0)
            assert delivery.num_delivered == delivery_number
            assert delivery.subject == f"sie.work.default.default.default.{MINILM.replace('/', '__')}"
            await delivery.in_progress()  # nothing to restart here
            await delivery.nak(delay_s)
        [result] = await asyncio.wait_for(submitted, 5.0)
    assert (result.success, result.error_code, result.retry_after_s) == (False, codes.RESOURCE_EXHAUSTED, 1)
    assert "3 times" in (result.error or "")


async def test_an_ack_without_a_result_is_answered_with_an_error(ingest_path: Path) -> None:
    async with LocalIngest(config(ingest_path), LANE, "w-1") as ingest, LocalIngestClient(ingest_path) as client:
        [item] = await _items(client, ["late"])
        submitted = asyncio.get_running_loop().create_task(
            client.submit([attrs.evolve(item, deadline=time.time() - 1)])
        )
        [delivery] = await ingest.fetch(8, 5.0)
        await delivery.ack()  # as abandonment ACK-drops work past its deadline
        [result] = await asyncio.wait_for(submitted, 5.0)
    assert (result.success, result.error_code) == (False, codes.GATEWAY_TIMEOUT)


class Broker:
    """The real bus's part: what was published to it."""

    def __init__(self) -> None:
        self.results: list[tuple[str, Any]] = []

    @property
    def max_payload(self) -> int:
        return 1024

    async def publish_result(self, subject: str, result: Any) -> None:
        self.results.append((subject, result))


async def test_results_go_to_their_connection_and_one_over_the_frame_limit_is_answered_too_large(
    ingest_path: Path,
) -> None:
    async with LocalIngest(config(ingest_path), LANE, "w-1") as ingest, LocalIngestClient(ingest_path) as client:
        broker = Broker()
        bus = ingest.results_bus(broker)  # type: ignore[arg-type]
        assert isinstance(bus, LocalResultBus) and bus.max_payload == 1024
        submitted = asyncio.get_running_loop().create_task(client.submit(await _items(client, ["small", "big"])))
        deliveries = await ingest.fetch(8, 5.0)
        assert len(deliveries) == 2
        bodies = [np.ones(4, np.float32), np.zeros(MAX_FRAME // 4, np.float32)]
        for delivery, values in zip(deliveries, bodies, strict=True):
            item = delivery.item
            assert ingest.owns(item.reply_subject)
            result = WorkResult(work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                                success=True, result_msgpack=ResultBody.of({"values": values}))  # fmt: skip
            await bus.publish_result(item.reply_subject, result)
            await delivery.ack()
        await bus.publish_result("_INBOX.gw-1.req", "for the broker")
        small, big = await asyncio.wait_for(submitted, 5.0)
    assert small.success and small.result_msgpack is not None
    np.testing.assert_array_equal(small.result_msgpack.value["values"], bodies[0])
    assert (big.success, big.error_code, big.result_msgpack) == (False, codes.PAYLOAD_TOO_LARGE, None)
    assert broker.results == [("_INBOX.gw-1.req", "for the broker")]


async def test_leaving_answers_what_is_unanswered_and_removes_the_socket(ingest_path: Path) -> None:
    async with AsyncExitStack() as stack:
        ingest = await stack.enter_async_context(LocalIngest(config(ingest_path), LANE, "w-1"))
        client = await stack.enter_async_context(LocalIngestClient(ingest_path))
        submitted = asyncio.get_running_loop().create_task(client.submit(await _items(client, ["a", "b"])))
        await eventually(lambda: ingest.unanswered == 2, what="both items to arrive")
        await ingest.__aexit__(None, None, None)
        results = await asyncio.wait_for(submitted, 5.0)
        assert [result.error_code for result in results] == [codes.SHUTTING_DOWN] * 2
        assert not await asyncio.to_thread(ingest_path.exists)
        with pytest.raises(SIEConnectionError):
            await client.submit(await _items(client, ["after"]))


async def test_a_client_that_leaves_is_forgotten(ingest_path: Path) -> None:
    async with LocalIngest(config(ingest_path), LANE, "w-1") as ingest:
        async with LocalIngestClient(ingest_path) as client:
            pending = asyncio.get_running_loop().create_task(client.submit(await _items(client, ["a", "b"])))
            await eventually(lambda: ingest.unanswered == 2, what="both items to arrive")
        with pytest.raises(SIEConnectionError):
            await pending
        await eventually(lambda: ingest.connections == 0, what="the connection to close")
        assert await ingest.fetch(8, 0.05) == []  # its items are not handed out


async def test_connections_past_the_limit_are_turned_away_and_counted(ingest_path: Path) -> None:
    telemetry = Telemetry()
    ingest = LocalIngest(config(ingest_path, max_connections=1), LANE, "w-1", SidecarMetrics(telemetry))
    async with ingest, LocalIngestClient(ingest_path) as first:
        with pytest.raises(ServerError) as caught:
            async with LocalIngestClient(ingest_path):
                pass
        assert caught.value.code == codes.QUEUE_FULL
        with pytest.raises(RequestError):
            await first.submit([attrs.evolve(item, pool_name="elsewhere") for item in await _items(first, ["a", "b"])])
    assert counts_by(telemetry, "sie_worker_local_ingest_connections_total", "outcome") == {
        "accepted": 1, "refused": 1
    }  # fmt: skip
    assert counts_by(telemetry, "sie_worker_local_ingest_refused_total", "reason") == {"invalid_input": 2}


async def test_the_socket_path_is_claimed_only_when_free(ingest_path: Path) -> None:
    await asyncio.to_thread(ingest_path.write_text, "not a socket")
    with pytest.raises(SocketPathError, match="not a socket"):
        async with LocalIngest(config(ingest_path), LANE, "w-1"):
            pass
    await asyncio.to_thread(ingest_path.unlink)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(ingest_path))  # a socket file nobody listens on: a sidecar that died
    async with LocalIngest(config(ingest_path), LANE, "w-1"):
        assert stat.S_IMODE(os.stat(ingest_path).st_mode) == 0o600
        with pytest.raises(SocketPathError, match="another process listens"):
            async with LocalIngest(config(ingest_path), LANE, "w-2"):
                pass
        assert await asyncio.to_thread(ingest_path.exists)  # the refused second server left the first one's socket
    assert not await asyncio.to_thread(ingest_path.exists)


async def test_a_client_that_reads_nothing_is_disconnected(ingest_path: Path) -> None:
    async with LocalIngest(config(ingest_path, write_timeout_s=0.2), LANE, "w-1") as ingest:
        _, writer, _ = await raw_connection(ingest_path)
        items = [encode_item(i, request_id="deaf", total_items=MAX_INFLIGHT) for i in range(MAX_INFLIGHT)]
        writer.write(frame({"type": "submit", "id": "deaf", "items": items}))
        await writer.drain()
        deliveries = await ingest.fetch(MAX_INFLIGHT, 5.0)
        assert len(deliveries) == MAX_INFLIGHT
        body = ResultBody.of({"values": np.zeros(MAX_FRAME // 5, np.float32)})  # most of a frame each
        bus = ingest.results_bus(Broker())  # type: ignore[arg-type]
        for delivery in deliveries:  # far more than the socket buffers hold, and nobody reads
            item = delivery.item
            result = WorkResult(work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                                success=True, result_msgpack=body)  # fmt: skip
            await bus.publish_result(item.reply_subject, result)
            await delivery.ack()
        await eventually(lambda: ingest.connections == 0, what="the deaf client to be disconnected")
        assert ingest.unanswered == 0
        writer.transport.abort()


@pytest.mark.parametrize("turns", range(8))
async def test_connections_accepted_as_the_server_exits_are_closed_with_it(ingest_path: Path, turns: int) -> None:
    """Clients connecting as the server exits: asyncio takes a connection from accept to its handler over several
    turns of the loop (its protocol, transport, connection_made, the handler's task), and each connection caught at
    any of them is closed with the server, not left open for the garbage collector (a socket left so warns in
    whichever test runs next). The clients connect with blocking sockets, which takes the loop no turn, and the
    server is then given exactly `turns` turns before it exits."""
    clients = []
    async with LocalIngest(config(ingest_path), LANE, "w-1"):
        for _ in range(12):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(str(ingest_path))
            clients.append(client)
        for _ in range(turns):
            await asyncio.sleep(0)
    for client in clients:
        client.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=client)
        try:
            frames = await messages_until_closed(reader)  # returns at EOF: the server closed its side
        except ConnectionResetError:  # never accepted: the listener closed with it in its backlog
            frames = []
        refusals = [frame for frame in frames if frame["type"] == "error"]
        assert all(refusal["code"] == codes.SHUTTING_DOWN for refusal in refusals), refusals  # told why
        with contextlib.suppress(ConnectionResetError):
            await close(writer)
    gc.collect()  # an accepted socket nobody closed would warn here (and fail the test: warnings are errors)
