"""The sidecar component: wires the stages (consumer → admission → readiness → prep → scheduler →
dispatcher → settlement) for one lane and one worker, and runs their tasks as an async context manager.
It owns lifecycles only; every decision lives in the stage modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import attrs

from sie.ipc.client import WorkerClient
from sie.settings import BatchingSettings, Settings, SidecarSettings, StreamSettings
from sie.sidecar.admission import Admission
from sie.sidecar.consumer import Consumer, ConsumerOptions
from sie.sidecar.dispatcher import Dispatcher
from sie.sidecar.hashgate import HashGatedAdmit, WorkerHash
from sie.sidecar.prep import Preparer
from sie.sidecar.readiness import Readiness, ReadinessTimings
from sie.sidecar.scheduler import Scheduler
from sie.sidecar.settlement import Settler
from sie.transport.base import Lane, LaneConsumer, Transport
from sie.wire.ipc_control import EnsureModelReadyResponse

logger = logging.getLogger(__name__)

_STOP_FETCH_TIMEOUT_S: Final = 1.0


@attrs.frozen
class SidecarConfig:
    """Everything a sidecar reads from settings, plus how many batches per model may run at once."""

    sidecar: SidecarSettings = attrs.Factory(SidecarSettings)
    batching: BatchingSettings = attrs.Factory(BatchingSettings)
    stream: StreamSettings = attrs.Factory(StreamSettings)
    worker_id: str = "worker-unknown"
    max_inflight_batches: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> SidecarConfig:
        return cls(settings.sidecar, settings.batching, settings.stream, settings.process.worker_id)


class Sidecar:
    """Consumes one lane and serves it with one worker. `async with Sidecar(...)` starts it; leaving
    the block stops fetching, gives back queued work and cancels the tasks; `drain()` first finishes
    in-flight work up to a deadline."""

    def __init__(
        self, transport: Transport, worker: WorkerClient, lane: Lane, config: SidecarConfig | None = None
    ) -> None:
        self.transport = transport
        self.worker = worker
        self.lane = lane
        self.config = config or SidecarConfig()
        self._stack: contextlib.AsyncExitStack | None = None
        self._consumer: Consumer | None = None
        self._consumer_task: asyncio.Task[None] | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self.admission: Admission | None = None
        self.readiness: Readiness | None = None
        self.scheduler: Scheduler | None = None
        self.dispatcher: Dispatcher | None = None
        self.settler: Settler | None = None
        self._preparer: Preparer | None = None
        self.hash_gate: HashGatedAdmit | None = None
        # Set before entering to be told every EnsureModelReady answer (the health publisher's `observe`).
        self.on_readiness_answer: Callable[[str, EnsureModelReadyResponse], None] | None = None

    @classmethod
    def from_settings(cls, transport: Transport, worker: WorkerClient, settings: Settings) -> Sidecar:
        """The sidecar of the lane named by SIE_POOL / SIE_MACHINE_PROFILE / SIE_BUNDLE."""
        lane = Lane(settings.lane.pool, settings.lane.machine_profile, settings.lane.bundle)
        return cls(transport, worker, lane, SidecarConfig.from_settings(settings))

    @property
    def pending(self) -> int:
        """Work items admitted and not yet settled."""
        return self.admission.total if self.admission else 0

    @property
    def fetching(self) -> bool:
        """Whether the lane consumer is still fetching (false after `drain` or exit)."""
        return self._consumer_task is not None and not self._consumer_task.done()

    @property
    def batches(self) -> int:
        """RunBatch calls made so far."""
        return self.dispatcher.batches if self.dispatcher else 0

    async def __aenter__(self) -> Sidecar:
        config = self.config
        stack = contextlib.AsyncExitStack()
        try:
            lane_consumer = await self.transport.consumer(self.lane)
            executor = ThreadPoolExecutor(config.batching.tokenizer_threads, thread_name_prefix="sie-tokenize")
            stack.callback(executor.shutdown, wait=False, cancel_futures=True)
            self._build(lane_consumer, executor)
            self._start(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        await self._stop_fetching()
        await self._give_back()
        await stack.aclose()

    async def drain(self, deadline_s: float) -> bool:
        """Stop fetching, give held work back, and wait up to `deadline_s` for everything admitted to be
        settled; what is still queued then is NAKed. True when all work finished in time."""
        if self.admission is None or self.readiness is None:
            return True
        await self._stop_fetching()
        await self.readiness.release_holds()
        finished = await self.admission.wait_idle(deadline_s)
        if not finished:
            await self._give_back()
        return finished

    def _build(self, lane_consumer: LaneConsumer, executor: ThreadPoolExecutor) -> None:
        config = self.config
        stream = config.stream
        admission = Admission(config.batching.max_pending_items)
        settler = Settler(self.transport, admission)
        dispatcher = Dispatcher(self.worker, settler, config.worker_id, stream.nak_delay_s)
        scheduler = Scheduler(dispatcher.dispatch, config.batching.max_batch_wait_s, config.max_inflight_batches)
        preparer = Preparer(executor, scheduler.submit, lambda works: settler.nak(works, stream.nak_delay_s),
                            workers=min(2, config.batching.tokenizer_threads))  # fmt: skip
        timings = ReadinessTimings.from_settings(stream, config.sidecar)
        readiness = Readiness(self.worker, settler, config.batching, timings, config.worker_id, preparer.put)
        dispatcher.on_model_unready = readiness.forget
        readiness.on_answer = self.on_readiness_answer
        options = ConsumerOptions(config.sidecar.fetch_budget, stream.nak_delay_s, config.worker_id)
        # Deliveries for another config are NAKed before any IPC for them (seed 000 §2).
        self.hash_gate = HashGatedAdmit(WorkerHash(self.worker), readiness.admit, settler.nak, stream.nak_delay_s)
        self._consumer = Consumer(lane_consumer, admission, settler, self.hash_gate, options)
        self.admission, self.settler, self.readiness = admission, settler, readiness
        self.scheduler, self.dispatcher, self._preparer = scheduler, dispatcher, preparer

    def _start(self, stack: contextlib.AsyncExitStack) -> None:
        # Closed in reverse: consumer first (no new work), then readiness, prep, scheduler, dispatcher.
        self.dispatcher.start()
        stack.push_async_callback(self.dispatcher.close)
        stack.push_async_callback(self.scheduler.close)
        self._preparer.start()
        stack.push_async_callback(self._preparer.close)
        stack.push_async_callback(self.readiness.close)
        loop = asyncio.get_running_loop()
        self._keepalive_task = loop.create_task(self._keepalive(), name="sie-sidecar-keepalive")
        stack.push_async_callback(_cancel, self._keepalive_task)
        self._consumer_task = loop.create_task(self._consumer.run(), name=f"sie-sidecar-consumer-{self.lane.pool}")
        stack.push_async_callback(_cancel, self._consumer_task)

    async def _stop_fetching(self) -> None:
        if self._consumer is None or self._consumer_task is None:
            return
        self._consumer.stop()
        try:
            async with asyncio.timeout(_STOP_FETCH_TIMEOUT_S):
                await asyncio.shield(self._consumer_task)
        except TimeoutError:
            await _cancel(self._consumer_task)
        except Exception:  # noqa: BLE001 - the consumer's own failure is logged; stopping goes on
            logger.exception("the lane consumer failed")

    async def _give_back(self) -> None:
        """NAK (no delay) work that is held or queued but not running, so another worker can take it."""
        if self.readiness is not None:
            await self.readiness.release_holds()
        if self.scheduler is not None and self.settler is not None:
            queued = self.scheduler.drain_pending()
            if queued:
                await self.settler.nak(queued, 0.0)

    async def _keepalive(self) -> None:
        """Progress-ACK work that waits in the scheduler or runs longer than half the ack-wait."""
        interval = self.config.stream.ack_wait_s / 4.0
        while True:
            await asyncio.sleep(interval)  # a housekeeping tick, far off the request path
            now = time.monotonic()
            stale = [w for w in self.scheduler.waiting() if now - w.progressed >= 2 * interval]
            if stale:
                await self.settler.in_progress(stale, now)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


__all__ = ["Sidecar", "SidecarConfig"]
