"""Generation through a real sidecar on a real nats-server (seed 001 "Generation"): a generate work item taken off the
lane runs on the worker with ProcessGenerate (a scripted worker: the worker is the seam here, the broker is real),
its chunks reach the gateway's inbox in order, the message is ACKed from the worker's `ack` on (never redelivered,
though the stream outlives the ack-wait), encode work flows beside it, a failure before the ack is redelivered and
one after it ends the stream with an error chunk, `cancel.{router}.{request}` stops a running stream and drops a
queued one, and a stopping sidecar gives back what it had not ACKed. On the loopback: the keepalive progress-ACKs a
stream only until it is ACKed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import pytest

from launcher import NatsServer
from sie.catalog import Catalog
from sie.catalog.names import generate_cancel_subject, work_subject
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.sidecar import Sidecar, SidecarConfig
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.transport.nats import NatsTransport
from sie.wire import codes
from sie.wire.generate import FINISH_CANCELLED, FINISH_ERROR, FINISH_STOP, GenerateChunk
from sie.wire.queue import WorkItem, WorkResult
from sie.worker.null_backend import NullWorkerService
from support.polling import eventually
from support.sidecar_fakes import (
    ACK,
    DONE,
    Fail,
    Publish,
    ScriptedGenerateWorker,
    Sleep,
    UntilCancelled,
    Wait,
)

GENERATOR = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
ROUTER = "gw-gen"
WAIT_S = 10.0
ACK_WAIT_S = 1.0
STREAMS = StreamSettings(nak_delay_s=0.1, ack_wait_s=ACK_WAIT_S, max_deliver=5, max_msgs=5000, max_age_s=900.0)


@pytest.fixture
def lane() -> Lane:
    return Lane(pool=f"g{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")


def make_item(lane: Lane, operation: str = "generate", model_id: str = GENERATOR) -> WorkItem:
    request_id = f"q-{uuid.uuid4().hex[:10]}"
    return WorkItem(
        work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, total_items=1, operation=operation,
        model_id=model_id, profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile,
        router_id=ROUTER, reply_subject=f"_INBOX.{ROUTER}.{request_id}", timestamp=time.time(), item={"text": "hi"},
    )  # fmt: skip


class Gateway:
    """The gateway's side on its own connection: publishes work and cancels, collects chunks and results."""

    def __init__(self, transport: NatsTransport | LoopbackTransport, lane: Lane) -> None:
        self.transport = transport
        self.lane = lane
        self.chunks: dict[str, list[GenerateChunk]] = defaultdict(list)
        self.results: dict[str, WorkResult] = {}

    async def collect(self, message: object) -> None:
        if isinstance(message, GenerateChunk):
            self.chunks[message.request_id].append(message)
        else:
            assert isinstance(message, WorkResult)
            self.results[message.request_id] = message

    async def publish(self, item: WorkItem) -> str:
        lane = self.lane
        await self.transport.publish_work(
            work_subject(lane.pool, lane.machine_profile, lane.bundle, item.model_id), item
        )
        return item.request_id

    async def cancel(self, request_id: str) -> None:
        await self.transport.publish(generate_cancel_subject(ROUTER, request_id), {})
        await self.transport.flush()

    async def finished(self, request_id: str) -> list[GenerateChunk]:
        """The chunks of `request_id` once a terminal one arrived."""
        await eventually(
            lambda: any(chunk.done for chunk in self.chunks[request_id]), timeout_s=WAIT_S, what=f"{request_id} done"
        )
        return self.chunks[request_id]


@asynccontextmanager
async def gateway(transport: NatsTransport | LoopbackTransport, lane: Lane) -> AsyncIterator[Gateway]:
    gw = Gateway(transport, lane)
    subscription = await transport.subscribe_results(f"_INBOX.{ROUTER}.>", gw.collect)
    try:
        yield gw
    finally:
        await subscription.unsubscribe()


def _nats(server: NatsServer, streams: StreamSettings = STREAMS) -> NatsTransport:
    return NatsTransport(NatsSettings(url=server.url), streams)


@asynccontextmanager
async def serving(
    server: NatsServer, lane: Lane, worker: ScriptedGenerateWorker, streams: StreamSettings = STREAMS
) -> AsyncIterator[Sidecar]:
    """A sidecar of `lane` on its own NATS connection, in front of `worker`."""
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(_nats(server, streams))
        config = SidecarConfig(stream=streams, worker_id="w-gen")
        yield await stack.enter_async_context(Sidecar(transport, worker, lane, config))


def texts(chunks: list[GenerateChunk]) -> str:
    return "".join(chunk.text_delta for chunk in chunks)


async def test_a_stream_reaches_the_inbox_in_order_is_acked_once_and_encode_flows_beside_it(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    later = asyncio.Event()
    script = [Publish("The capital"), ACK, Wait(later), Publish(" is Paris."),
              Publish("", done=True, finish_reason=FINISH_STOP), ACK, DONE]  # fmt: skip
    worker = ScriptedGenerateWorker(lambda item, call: script, NullWorkerService(baseline_catalog, "w-gen", 64))
    async with _nats(nats_server) as transport, gateway(transport, lane) as gw, serving(nats_server, lane, worker):
        generated = await gw.publish(make_item(lane))
        encoded = await gw.publish(make_item(lane, "encode", ENCODER))
        await eventually(lambda: encoded in gw.results, timeout_s=WAIT_S, what="the encode result")
        assert gw.results[encoded].success and not any(chunk.done for chunk in gw.chunks[generated])  # mid-stream
        # The stream runs on past the ack-wait after the worker's ack: were it not ACKed it would be redelivered.
        await asyncio.sleep(ACK_WAIT_S * 1.5)
        later.set()
        chunks = await gw.finished(generated)
        assert [chunk.seq for chunk in chunks] == [0, 1, 2] and texts(chunks) == "The capital is Paris."
        assert chunks[-1].finish_reason == FINISH_STOP and {chunk.attempt_id for chunk in chunks} == {
            f"{generated}.0/1"
        }
        assert worker.calls_of(generated) == 1  # not redelivered
        assert worker.inner.counts[ENCODER] == (1, 1)  # the encode item was batched, not generated
        await eventually(lambda: _pending(transport, lane), timeout_s=WAIT_S, what="an empty stream")


async def _pending(transport: NatsTransport, lane: Lane) -> bool:
    return await transport.pending(lane.pool) == 0


async def test_a_failure_before_the_ack_is_redelivered_and_one_after_it_ends_with_an_error_chunk(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    def script(item: WorkItem, call: int) -> list:
        if item.item == {"text": "retried"}:
            return (
                [Publish("lost"), Fail()] if call == 1 else [Publish("ok", done=True, finish_reason=FINISH_STOP), DONE]
            )
        return [Publish("half"), ACK, Fail()]

    worker = ScriptedGenerateWorker(script, NullWorkerService(baseline_catalog, "w-gen", 64))
    async with _nats(nats_server) as transport, gateway(transport, lane) as gw, serving(nats_server, lane, worker):
        retried = await gw.publish(attrs.evolve(make_item(lane), item={"text": "retried"}))
        broken = await gw.publish(make_item(lane))
        retried_chunks = await gw.finished(retried)
        # The first attempt's chunk reached the inbox before its failure; the second attempt finished.
        assert [(chunk.attempt_id, chunk.seq) for chunk in retried_chunks] == [
            (f"{retried}.0/1", 0),
            (f"{retried}.0/2", 0),
        ]
        assert retried_chunks[-1].finish_reason == FINISH_STOP and worker.calls_of(retried) == 2
        broken_chunks = await gw.finished(broken)
        assert [chunk.seq for chunk in broken_chunks] == [0, 1] and worker.calls_of(broken) == 1
        terminal = broken_chunks[-1]
        assert terminal.finish_reason == FINISH_ERROR and terminal.error_code == codes.INFERENCE_ERROR
        assert terminal.attempt_id == broken_chunks[0].attempt_id and terminal.worker_id == "w-gen"


async def test_a_cancel_stops_a_running_stream_and_drops_a_queued_one(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    ready = asyncio.Event()
    ready.set()
    script = [Publish("once upon"), ACK, UntilCancelled(), Publish("", done=True, finish_reason=FINISH_CANCELLED), DONE]
    worker = GatedWorker(lambda item, call: script, NullWorkerService(baseline_catalog, "w-gen", 64), ready)
    async with (
        _nats(nats_server) as transport,
        gateway(transport, lane) as gw,
        serving(nats_server, lane, worker) as sidecar,
    ):
        running = await gw.publish(make_item(lane))
        await eventually(lambda: sidecar.generating == 1 and gw.chunks[running], timeout_s=WAIT_S, what="a stream")
        ready.clear()  # the next model's readiness answer waits: its work stays queued in the sidecar
        queued = await gw.publish(make_item(lane, model_id=ENCODER))
        await eventually(lambda: sidecar.pending == 2, timeout_s=WAIT_S, what="the second item fetched")
        await gw.cancel(queued)
        await gw.cancel(running)  # heard after the first: once it reached the worker, so did the first
        chunks = await gw.finished(running)
        assert chunks[-1].finish_reason == FINISH_CANCELLED and worker.cancels == [running]
        ready.set()
        await eventually(lambda: sidecar.pending == 0, timeout_s=WAIT_S, what="the queued item dropped")
        assert sidecar.abandoned == {"cancelled": 1} and worker.calls_of(queued) == 0 and not gw.chunks[queued]
        await eventually(lambda: _pending(transport, lane), timeout_s=WAIT_S, what="an empty stream")


class GatedWorker(ScriptedGenerateWorker):
    """Answers readiness only while `ready` is set."""

    def __init__(self, script, inner, ready: asyncio.Event) -> None:
        super().__init__(script, inner)
        self.ready = ready

    async def ensure_model_ready(self, request):
        await self.ready.wait()
        return await super().ensure_model_ready(request)


async def test_a_stopping_sidecar_gives_back_an_unacked_stream_and_ends_an_acked_one(
    nats_server: NatsServer, lane: Lane, baseline_catalog: Catalog
) -> None:
    def script(item: WorkItem, call: int) -> list:
        if item.item == {"text": "unacked"}:
            return [Publish("draft"), UntilCancelled()] if call == 1 else [Publish("fine", done=True), ACK, DONE]
        return [Publish("started"), ACK, UntilCancelled()]

    worker = ScriptedGenerateWorker(script, NullWorkerService(baseline_catalog, "w-gen", 64))
    # A long ack-wait: only the NAK gives the unacked item back soon (its progress ACKs would hold it for seconds).
    streams = attrs.evolve(STREAMS, ack_wait_s=6.0)
    async with _nats(nats_server, streams) as transport, gateway(transport, lane) as gw:
        async with serving(nats_server, lane, worker, streams) as sidecar:
            unacked = await gw.publish(attrs.evolve(make_item(lane), item={"text": "unacked"}))
            acked = await gw.publish(make_item(lane))
            await eventually(lambda: sidecar.generating == 2 and len(worker.running) == 2, timeout_s=WAIT_S)
            await eventually(lambda: gw.chunks[acked] and gw.chunks[unacked], timeout_s=WAIT_S)
            stopped = time.monotonic()
        assert sorted(worker.cancels) == sorted([unacked, acked])  # the worker stops decoding both
        ended = await gw.finished(acked)
        assert [chunk.seq for chunk in ended] == [0, 1] and ended[-1].finish_reason == FINISH_ERROR
        async with serving(nats_server, lane, worker, streams):  # given back at once: the next sidecar finishes it
            chunks = await gw.finished(unacked)
            assert time.monotonic() - stopped < 3.0
        assert chunks[-1].attempt_id == f"{unacked}.0/2" and worker.calls_of(acked) == 1


async def test_the_keepalive_renews_a_stream_only_until_it_is_acked(lane: Lane) -> None:
    ack_wait = 0.4
    finish = asyncio.Event()
    script = [Sleep(ack_wait * 2), Publish("a"), ACK, Wait(finish), Publish("", done=True), DONE]
    worker = ScriptedGenerateWorker(lambda item, call: script)
    streams = StreamSettings(ack_wait_s=ack_wait, nak_delay_s=0.1)
    transport = ProgressCounting(streams)
    async with transport, gateway(transport, lane) as gw:
        config = SidecarConfig(stream=streams, worker_id="w-gen")
        async with Sidecar(transport, worker, lane, config):
            request = await gw.publish(make_item(lane))
            work_item_id = f"{request}.0"
            await eventually(lambda: work_item_id in transport.acked, timeout_s=WAIT_S, what="the ACK")
            renewed = transport.progress[work_item_id]
            assert renewed >= 1  # renewed while the worker had not acked it yet
            await asyncio.sleep(ack_wait * 2)  # several keepalive ticks
            assert transport.progress[work_item_id] == renewed
            finish.set()
            await gw.finished(request)
        assert worker.calls_of(request) == 1


class ProgressCounting(LoopbackTransport):
    """A loopback whose deliveries count their progress ACKs."""

    def __init__(self, settings: StreamSettings) -> None:
        super().__init__(settings)
        self.progress: Counter[str] = Counter()
        self.acked: set[str] = set()

    async def consumer(self, lane: Lane):
        inner = await super().consumer(lane)
        transport = self

        class Counting:
            async def fetch(self, max_items: int, timeout_s: float):
                deliveries = await inner.fetch(max_items, timeout_s)
                return [_Counted(delivery, transport) for delivery in deliveries]

        return Counting()


class _Counted:
    def __init__(self, delivery, transport: ProgressCounting) -> None:
        self._delivery = delivery
        self._transport = transport
        self.item = delivery.item
        self.subject = delivery.subject
        self.num_delivered = delivery.num_delivered

    async def ack(self) -> None:
        self._transport.acked.add(self.item.work_item_id)
        await self._delivery.ack()

    async def nak(self, delay_s: float = 0.0) -> None:
        await self._delivery.nak(delay_s)

    async def in_progress(self) -> None:
        self._transport.progress[self.item.work_item_id] += 1
        await self._delivery.in_progress()
