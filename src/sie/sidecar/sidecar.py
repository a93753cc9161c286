"""The sidecar component: builds the pipeline of one lane and one worker in the order work flows through it
(consumer → readiness → preparation → scheduler → dispatcher → settlement), runs its loops as an async
context manager, drains it on shutdown. It owns lifecycles only; every decision lives in the stage modules.
Generate work leaves after readiness for the generation stage (one ProcessGenerate stream per item, settled as the
worker's events say), which also hears `cancel.>`.

Where the transport has worker direct-dispatch (seed 000 §8.2: a capped logical pool's gateway publishes on this
worker's own subject, so unassigned workers of the lane never see, and NAK, that work), a second consumer fetches
from the worker's stream into the same admission, gates and `admitted` channel, and starts, stops, drains and
gives work back with the lane consumer; the sidecar then also hears `batch_cancel.*.{worker}.*`, which drops the
direct work of a request the gateway has since published on the lane.

With local ingest (SIE_LOCAL_INGEST_SOCKET, seed 001 "Local Ingest") a third source, the socket's, feeds the same
stages through a consumer of its own; its results go back over the socket, not the broker (`sie.sidecar.local_ingest`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Final

import attrs

from sie.catalog.names import batch_cancel_wildcard
from sie.ipc.client import WorkerClient
from sie.runtime.periodic import Outage, PeriodicTask
from sie.settings import BatchingSettings, Settings, SidecarSettings, StreamSettings
from sie.sidecar.abandonment import (
    CANCEL_SUBJECTS,
    GENERATE_CANCEL_SUBJECTS,
    Abandonment,
    Tombstones,
    tombstone_horizon,
)
from sie.sidecar.admission import Admission
from sie.sidecar.consumer import DIRECT_FETCH_WAIT_S, Consumer, ConsumerOptions
from sie.sidecar.dispatcher import BatchDispatcher
from sie.sidecar.generation import GenerateSplit, Generations
from sie.sidecar.hashgate import WorkerHash
from sie.sidecar.local_ingest import LocalIngest, LocalIngestConfig
from sie.sidecar.payloads import DEFAULT_FETCH_MAX_BYTES, PayloadResolver
from sie.sidecar.pinning import PinnedModels
from sie.sidecar.pool_admission import PoolGate
from sie.sidecar.prep import Preparer
from sie.sidecar.publishing import ResultPublisher
from sie.sidecar.readiness import Observe, Readiness, ReadinessOptions, ReadyModels
from sie.sidecar.results import preparation_failed_result
from sie.sidecar.scheduler import Scheduler
from sie.sidecar.settlement import Settler
from sie.sidecar.work import AdmittedGroup, Channel, ReadyGroup, Work
from sie.stores.payload_store import PayloadStore, open_payload_store
from sie.telemetry.sidecar import SidecarMetrics
from sie.telemetry.tracing import Tracing
from sie.transport.base import Lane, LaneConsumer, MessageBus, Transport

logger = logging.getLogger(__name__)

_STOP_FETCH_TIMEOUT_S: Final = 1.0
# Groups a channel between two stages holds before the stage upstream waits (backpressure).
CHANNEL_GROUPS: Final = 8
# Preparation loops sharing one channel: one tokenizes while another hands its group on.
PREPARATION_LOOPS: Final = 2


@attrs.frozen
class SidecarConfig:
    """Everything a sidecar reads from settings, plus how many batches per model may run at once, the payload
    store offloaded work items are read from (None: `--role all`, or no SIE_PAYLOAD_STORE_URL), the process's
    tracing (off unless given), its metrics (none recorded unless given), its pool admission gate (None: no
    SIE_GATEWAY_URL, every item admitted; the sidecar runs its polling while it runs) and its local-ingest socket
    (None: no SIE_LOCAL_INGEST_SOCKET; the sidecar serves it while it runs)."""

    sidecar: SidecarSettings = attrs.Factory(SidecarSettings)
    batching: BatchingSettings = attrs.Factory(BatchingSettings)
    stream: StreamSettings = attrs.Factory(StreamSettings)
    worker_id: str = "worker-unknown"
    max_inflight_batches: int = 2
    payload_store: PayloadStore | None = None
    payload_fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    tracing: Tracing = attrs.Factory(Tracing.off)
    metrics: SidecarMetrics | None = None
    pool_gate: PoolGate | None = None
    local_ingest: LocalIngestConfig | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, tracing: Tracing | None = None, metrics: SidecarMetrics | None = None
    ) -> SidecarConfig:
        payloads = settings.payloads
        return cls(
            settings.sidecar, settings.batching, settings.stream, settings.process.worker_id,
            payload_store=open_payload_store(payloads.store_url), payload_fetch_max_bytes=payloads.fetch_max_bytes,
            tracing=tracing or Tracing.off(), metrics=metrics, pool_gate=PoolGate.from_settings(settings, metrics),
            local_ingest=LocalIngestConfig.from_settings(settings),
        )  # fmt: skip


@attrs.frozen
class WorkerHooks:
    """What the stages hear from, and ask about, the worker side besides its IPC calls."""

    observe: Observe | None = None  # hears every EnsureModelReady answer (health reports load failures)
    replicas: Callable[[str], int] | None = None  # worker children running a model at once (1 when None)


@attrs.frozen
class WorkSources:
    """Where the sidecar's work comes from: the lane's consumer, the worker's direct-dispatch consumer where the
    transport has one (seed 000 §8.2), and the local-ingest socket where one is served."""

    lane: LaneConsumer
    direct: LaneConsumer | None = None
    local: LocalIngest | None = None


@attrs.frozen
class Pipeline:
    """One lane's stages, the channels between them, and the state every stage settles through."""

    admission: Admission
    abandonment: Abandonment
    settler: Settler
    dispatcher: BatchDispatcher
    consumer: Consumer
    readiness: Readiness
    preparer: Preparer
    scheduler: Scheduler
    generations: Generations  # generate work, from readiness
    admitted: Channel[AdmittedGroup]  # consumers → readiness
    ready: Channel[ReadyGroup]  # readiness → preparation (generate work goes to `generations` instead)
    prepared: Channel[ReadyGroup]  # preparation → scheduler
    direct: Consumer | None = None  # the worker's direct-dispatch consumer, feeding `admitted` too
    local: Consumer | None = None  # the local-ingest socket's consumer, feeding `admitted` too

    def consumers(self) -> list[Consumer]:
        """The fetching stages: the lane consumer, then the direct-dispatch and local-ingest ones where they exist."""
        return [consumer for consumer in (self.consumer, self.direct, self.local) if consumer is not None]

    def loops(self) -> list[Coroutine[Any, Any, None]]:
        """The stages' loops, in data-flow order, the consumers' first (the dispatcher runs its own)."""
        return [
            *(consumer.run() for consumer in self.consumers()),
            self.readiness.serve(self.admitted),
            *(self.preparer.serve(self.ready) for _ in range(PREPARATION_LOOPS)),
            self.scheduler.serve(self.prepared),
        ]

    def queued(self) -> list[Work]:
        """Work waiting in the channels and the scheduler (not running), removed so it can be given back."""
        groups = [*self.admitted.drain(), *self.ready.drain(), *self.prepared.drain()]
        return [work for _, works in groups for work in works] + self.scheduler.drain_pending()


def build_pipeline(
    sources: WorkSources,
    bus: MessageBus,
    worker: WorkerClient,
    config: SidecarConfig,
    executor: Executor,
    hooks: WorkerHooks | None = None,
) -> Pipeline:
    """The stages of one lane, built in the order work flows through them; the direct-dispatch and local-ingest
    sources, if any, get a consumer stage each, sharing everything downstream. Local-ingest results leave through
    the ingest, never the broker."""
    hooks = hooks or WorkerHooks()
    stream, batching = config.stream, config.batching
    local = sources.local
    if local is not None:
        bus = local.results_bus(bus)
    # The two ends every stage settles through: the broker (results, ACKs, NAKs) and the worker (RunBatch).
    admission = Admission(batching.max_pending_items, metrics=config.metrics)
    horizon = tombstone_horizon(stream.max_age_s, stream.ack_wait_s, stream.max_deliver)
    abandonment = Abandonment(Tombstones(horizon))
    # Results within the broker's message limit (chunked when too large), known once connected.
    publisher = ResultPublisher(bus, lambda: bus.max_payload, config.metrics, local.owns if local else None)
    settler = Settler(bus, admission, abandonment, publisher)
    models = ReadyModels(batching, hooks.observe)
    dispatcher = BatchDispatcher(worker, settler, models.forget, config.worker_id, stream.nak_delay_s, config.tracing)
    # The stages, joined by bounded channels.
    admitted: Channel[AdmittedGroup] = Channel(CHANNEL_GROUPS)
    ready: Channel[ReadyGroup] = Channel(CHANNEL_GROUPS)
    prepared: Channel[ReadyGroup] = Channel(CHANNEL_GROUPS)
    options = ConsumerOptions(config.sidecar.fetch_budget, stream.nak_delay_s, config.worker_id, config.pool_gate)
    worker_hash = WorkerHash(worker)
    consumer = Consumer(sources.lane, admission, settler, worker_hash, admitted, options)
    direct: Consumer | None = None
    if sources.direct is not None:
        direct_options = attrs.evolve(options, fetch_wait_s=DIRECT_FETCH_WAIT_S)
        direct = Consumer(sources.direct, admission, settler, worker_hash, admitted, direct_options)
    local_consumer: Consumer | None = None
    if local is not None:  # work sent to this worker itself: no logical pool's gate applies
        local_consumer = Consumer(local, admission, settler, worker_hash, admitted, attrs.evolve(options, pools=None))
    readiness_options = ReadinessOptions.from_settings(stream, config.sidecar, config.worker_id)
    payloads = PayloadResolver(
        config.payload_store, settler.live, settler.reply, config.worker_id, config.payload_fetch_max_bytes,
        config.metrics,
    )  # fmt: skip
    generations = Generations(worker, settler, abandonment, config.worker_id, stream.nak_delay_s, payloads)
    readiness = Readiness(worker, settler, models, GenerateSplit(generations, ready), readiness_options)

    async def preparation_failed(works: list[Work]) -> None:
        await settler.reply([(work, preparation_failed_result(work.item, config.worker_id)) for work in works])

    preparer = Preparer(
        executor, prepared, preparation_failed, settler.live, payloads, config.tracing, answer=settler.reply,
        worker_id=config.worker_id,
    )  # fmt: skip
    scheduler = Scheduler(
        dispatcher.dispatch,
        batching.max_batch_wait_s,
        config.max_inflight_batches,
        replicas=hooks.replicas,
        metrics=config.metrics,
    )
    return Pipeline(
        admission, abandonment, settler, dispatcher, consumer, readiness, preparer, scheduler, generations,
        admitted, ready, prepared, direct, local_consumer,
    )  # fmt: skip


class Sidecar:
    """Consumes one lane and serves it with one worker, or a pod's worker children behind a `WorkerFleet`
    (`replicas` is then the fleet's). `async with Sidecar(...)` starts it; leaving the block stops fetching,
    gives back queued work and cancels the tasks; `drain()` first finishes in-flight work up to a deadline.
    `observe` hears every EnsureModelReady answer."""

    def __init__(
        self,
        transport: Transport,
        worker: WorkerClient,
        lane: Lane,
        config: SidecarConfig | None = None,
        observe: Observe | None = None,
        replicas: Callable[[str], int] | None = None,
    ) -> None:
        self.transport = transport
        self.worker = worker
        self.lane = lane
        self.config = config or SidecarConfig()
        self._hooks = WorkerHooks(observe, replicas)
        self._stack: contextlib.AsyncExitStack | None = None
        self._pipeline: Pipeline | None = None
        self._fetch_tasks: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []

    @classmethod
    def from_settings(
        cls,
        transport: Transport,
        worker: WorkerClient,
        settings: Settings,
        hooks: WorkerHooks | None = None,
        tracing: Tracing | None = None,
        metrics: SidecarMetrics | None = None,
    ) -> Sidecar:
        """The sidecar of the lane named by SIE_POOL / SIE_MACHINE_PROFILE / SIE_BUNDLE."""
        lane = Lane(settings.lane.pool, settings.lane.machine_profile, settings.lane.bundle)
        hooks = hooks or WorkerHooks()
        config = SidecarConfig.from_settings(settings, tracing, metrics)
        return cls(transport, worker, lane, config, hooks.observe, hooks.replicas)

    @property
    def pending(self) -> int:
        """Work items admitted and not yet settled."""
        return self._pipeline.admission.total if self._pipeline else 0

    @property
    def fetching(self) -> bool:
        """Whether a consumer (the lane's, the direct-dispatch or the local-ingest one) is still fetching (false after
        `drain` or exit)."""
        return any(not task.done() for task in self._fetch_tasks)

    @property
    def direct_dispatch(self) -> bool:
        """Whether this sidecar also consumes its worker's direct-dispatch stream (the transport has one)."""
        return self._pipeline is not None and self._pipeline.direct is not None

    @property
    def abandoned(self) -> dict[str, int]:
        """Work items ACK-dropped because nobody waited for them any more, by reason (expired, cancelled,
        fallen_back)."""
        return dict(self._pipeline.abandonment.dropped) if self._pipeline else {}

    @property
    def batches(self) -> int:
        """RunBatch calls made so far."""
        return self._pipeline.dispatcher.batches if self._pipeline else 0

    @property
    def generating(self) -> int:
        """Generation streams running now."""
        return self._pipeline.generations.running if self._pipeline else 0

    async def __aenter__(self) -> Sidecar:
        stack = contextlib.AsyncExitStack()
        try:
            if self.config.pool_gate is not None:  # polled once before the first fetch, then in the background
                self.config.pool_gate.keep_pinned_with(PinnedModels(self.worker).keep)  # the pools' pinned_models
                await stack.enter_async_context(self.config.pool_gate)
            local = None
            if self.config.local_ingest is not None:  # listening first: a path in the way stops the start at once
                ingest = LocalIngest(self.config.local_ingest, self.lane, self.config.worker_id, self.config.metrics)
                local = await stack.enter_async_context(ingest)
            sources = WorkSources(
                await self.transport.consumer(self.lane),
                await self.transport.worker_consumer(self.lane, self.config.worker_id),
                local,
            )
            threads = self.config.batching.tokenizer_threads
            executor = ThreadPoolExecutor(threads, thread_name_prefix="sie-tokenize")
            stack.callback(executor.shutdown, wait=False, cancel_futures=True)
            pipeline = build_pipeline(sources, self.transport, self.worker, self.config, executor, self._hooks)
            # The gateway announces requests it gave up on; their work is dropped wherever it still waits.
            cancels = await self.transport.subscribe(CANCEL_SUBJECTS, pipeline.abandonment.on_cancel)
            stack.push_async_callback(cancels.unsubscribe)
            # A generation the gateway stopped waiting for is dropped while queued and cancelled while it runs.
            generate_cancels = await self.transport.subscribe(GENERATE_CANCEL_SUBJECTS, pipeline.generations.on_cancel)
            stack.push_async_callback(generate_cancels.unsubscribe)
            if sources.direct is not None:  # the lane now answers these requests: their direct work is dropped
                subject = batch_cancel_wildcard(self.config.worker_id)
                batch_cancels = await self.transport.subscribe(subject, pipeline.abandonment.on_batch_cancel)
                stack.push_async_callback(batch_cancels.unsubscribe)
            await self._start(pipeline, stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._pipeline = stack, pipeline
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        await self._stop_fetching()
        for task in self._loops:  # nothing moves between stages while queued work is given back
            await _cancel(task)
        await self._give_back()
        await stack.aclose()

    async def drain(self, deadline_s: float) -> bool:
        """Stop fetching, give held work back, and wait up to `deadline_s` for everything admitted to be
        settled (running generation streams included); what is still queued then is NAKed. True when all work
        finished in time."""
        if self._pipeline is None:
            return True
        await self._stop_fetching()
        await self._pipeline.readiness.release_holds()
        finished = await self._pipeline.admission.wait_idle(deadline_s)
        if not finished:
            await self._give_back()
        return finished

    async def _start(self, pipeline: Pipeline, stack: contextlib.AsyncExitStack) -> None:
        # Closed in reverse: the loops first (no new work), then readiness, the scheduler, running generations
        # (given back, or ended on the worker), the dispatcher.
        pipeline.dispatcher.start()
        stack.push_async_callback(pipeline.dispatcher.close)
        stack.push_async_callback(pipeline.generations.close)
        stack.push_async_callback(pipeline.scheduler.close)
        stack.push_async_callback(pipeline.readiness.close)
        await stack.enter_async_context(self._keepalive(pipeline))
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(work, name=f"sie-sidecar-{self.lane.pool}") for work in pipeline.loops()]
        for task in self._loops:
            stack.push_async_callback(_cancel, task)
        self._fetch_tasks = self._loops[: len(pipeline.consumers())]  # `loops()` lists the consumers first

    async def _stop_fetching(self) -> None:
        if self._pipeline is None:
            return
        for consumer in self._pipeline.consumers():
            consumer.stop()
        await asyncio.gather(*(_stop_fetch_task(task) for task in self._fetch_tasks))

    async def _give_back(self) -> None:
        """NAK (no delay) work that is held or queued but not running, so another worker can take it."""
        if self._pipeline is None:
            return
        await self._pipeline.readiness.release_holds()
        queued = self._pipeline.queued()
        if queued:
            await self._pipeline.settler.nak(queued, 0.0)

    def _keepalive(self, pipeline: Pipeline) -> PeriodicTask:
        """Progress-ACK work held longer than half the ack-wait wherever it is (a channel, readiness, preparation,
        the scheduler, a running batch, its publication, a generation stream not yet ACKed), so JetStream
        redelivers only the work of a sidecar that died, one ack-wait after it stopped progress-ACKing."""
        interval = self.config.stream.ack_wait_s / 4.0  # a housekeeping tick, far off the request path

        async def progress_held_work() -> None:
            now = time.monotonic()
            stale = [work for work in pipeline.admission.held() if now - work.progressed >= 2 * interval]
            if stale:
                await pipeline.settler.in_progress(stale, now)

        return PeriodicTask(progress_held_work, interval, Outage("progress-ACKing held work", logger))


async def _stop_fetch_task(task: asyncio.Task[None]) -> None:
    """Let a stopped consumer finish the fetch in progress, for at most _STOP_FETCH_TIMEOUT_S, then cancel it."""
    try:
        async with asyncio.timeout(_STOP_FETCH_TIMEOUT_S):
            await asyncio.shield(task)
    except TimeoutError:
        await _cancel(task)
    except Exception:  # noqa: BLE001 - the consumer's own failure is logged; stopping goes on
        logger.exception("the consumer %s failed", task.get_name())


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


__all__ = ["Pipeline", "Sidecar", "SidecarConfig", "WorkSources", "WorkerHooks", "build_pipeline"]
