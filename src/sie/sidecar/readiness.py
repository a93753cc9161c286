"""Model readiness (contracts Part A §2.1 EnsureModelReady; seed 001 "Request Flow"): ready work goes on
to preparation; work for a model this worker is loading is held with progress ACKs while one poller per
model re-checks, until the model is ready or the work's deadline is near (then it is answered MODEL_LOADING,
which clients retry); failed answers are settled here and retry-later answers are NAKed with their delay
while the deadline allows another attempt. It never blocks the event loop.

`ReadyModels` remembers the worker's ready answers (and tells an observer every answer); the readiness
stage fills it and the dispatcher forgets a model the worker could not run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import attrs

from sie.ipc.client import WorkerClient
from sie.settings import BatchingSettings, SidecarSettings, StreamSettings
from sie.sidecar.results import load_failed_result, model_loading_result, resource_exhausted_result
from sie.sidecar.scheduler import batch_limits
from sie.sidecar.settlement import Settler
from sie.sidecar.work import AdmittedGroup, Channel, Outbox, ReadyGroup, ReadyModel, Work
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelDescriptor,
)
from sie.wire.queue import WorkResult

logger = logging.getLogger(__name__)

POLL_INTERVAL_S: Final = 0.1
# A ready answer is reused this long; a "not loaded" batch outcome forgets it sooner.
READY_TTL_S: Final = 1.0
OOM_ERROR_CLASS: Final = "OOM"
# Held work is answered this long before its deadline, so the answer reaches the gateway before it gives up.
ANSWER_MARGIN_S: Final = 1.0
LOADING_STATES: Final = frozenset({MODEL_STATE_LOADING_STARTED, MODEL_STATE_LOADING_IN_PROGRESS})

Observe = Callable[[str, EnsureModelReadyResponse], None]


def progress_interval(ack_wait_s: float, nak_delay_s: float) -> float:
    """How often held work is progress-ACKed: the retry delay, clamped below ack-wait (seed 001)."""
    ceiling = ack_wait_s / 2.0
    interval = min(nak_delay_s, ceiling) if nak_delay_s > 0 else ceiling
    return max(min(POLL_INTERVAL_S, ceiling), interval)


@attrs.frozen
class ReadinessOptions:
    """How the readiness stage paces itself (from the stream and sidecar settings) and the worker id its
    replies carry."""

    poll_s: float
    progress_s: float
    hold_s: float
    nak_delay_s: float
    worker_id: str = "worker-unknown"

    @classmethod
    def from_settings(cls, stream: StreamSettings, sidecar: SidecarSettings, worker_id: str) -> ReadinessOptions:
        return cls(
            poll_s=min(POLL_INTERVAL_S, stream.ack_wait_s / 4.0),
            progress_s=progress_interval(stream.ack_wait_s, stream.nak_delay_s),
            hold_s=sidecar.load_hold_s,
            nak_delay_s=stream.nak_delay_s,
            worker_id=worker_id,
        )


class ReadyModels:
    """The models the worker last answered ready, each reused for READY_TTL_S; every answer is also told to
    `observe` (the health publisher reports load failures from them)."""

    def __init__(
        self, batching: BatchingSettings, observe: Observe | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._batching = batching
        self._observe = observe
        self._clock = clock
        self._ready: dict[str, tuple[ReadyModel, float]] = {}

    def get(self, model_id: str) -> ReadyModel | None:
        """The ready model, while its answer is fresh."""
        cached = self._ready.get(model_id)
        return cached[0] if cached is not None and cached[1] > self._clock() else None

    def record(self, model_id: str, response: EnsureModelReadyResponse) -> ReadyModel | None:
        """Take one EnsureModelReady answer; the ready model with its batch limits when it says ready."""
        if self._observe is not None:
            self._observe(model_id, response)
        if response.state != MODEL_STATE_READY:
            return None
        limits = batch_limits(response.descriptor, response.batch_budget, self._batching)
        ready = ReadyModel(model_id=model_id, descriptor=response.descriptor or ModelDescriptor(), limits=limits)
        self._ready[model_id] = (ready, self._clock() + READY_TTL_S)
        return ready

    def forget(self, model_id: str) -> None:
        """Ask the worker again before the next work of this model (it said the model is not loaded)."""
        self._ready.pop(model_id, None)


@attrs.frozen
class Clocks:
    """Monotonic time measures how long work was held; wall time is compared with deadlines (absolute unix
    times set by the gateway)."""

    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


class _Hold:
    """Work waiting for one model's load, and the poller task watching it."""

    def __init__(self) -> None:
        self.works: list[Work] = []
        self.progressed = time.monotonic()
        self.task: asyncio.Task[None] | None = None


class Readiness:
    """Answers "may this model's work run now?" per model; one poller per loading model. Ready work goes to
    `out` (preparation)."""

    def __init__(
        self,
        worker: WorkerClient,
        settler: Settler,
        models: ReadyModels,
        out: Outbox[ReadyGroup],
        options: ReadinessOptions,
        clocks: Clocks | None = None,
    ) -> None:
        self._worker = worker
        self._settler = settler
        self._models = models
        self._out = out
        self._options = options
        self._worker_id = options.worker_id
        self._holds: dict[str, _Hold] = {}
        clocks = clocks or Clocks()
        self._clock = clocks.monotonic
        self._wall_clock = clocks.wall

    async def serve(self, inbox: Channel[AdmittedGroup]) -> None:
        """The stage's loop: route each admitted group as it arrives."""
        while True:
            model_id, works = await inbox.get()
            try:
                await self.admit(model_id, works)
            except Exception:  # noqa: BLE001 - a stage bug must not stop the lane; the group goes back
                logger.exception("admitting %d items of %s failed", len(works), model_id)
                await self._settler.nak(works, self._options.nak_delay_s)

    async def admit(self, model_id: str, works: list[Work]) -> None:
        """Route one model's admitted work by the worker's readiness answer."""
        hold = self._holds.get(model_id)
        if hold is not None:
            self._hold(hold, works)
            return
        ready = self._models.get(model_id)
        if ready is not None:
            await self._proceed(ready, works)
            return
        response = await self._ask(model_id)
        if response is None:
            await self._settler.nak(works, self._options.nak_delay_s)
        elif response.state == MODEL_STATE_READY:
            await self._proceed(self._models.get(model_id), works)
        elif response.state in LOADING_STATES:
            self._start_hold(model_id, works)
        else:
            await self._answer(response, works)

    def held(self) -> int:
        return sum(len(hold.works) for hold in self._holds.values())

    async def release_holds(self) -> None:
        """Give every held item back (drain): NAK without delay, so another worker may take it."""
        for hold in await self.close():
            await self._settler.nak(hold.works, 0.0)

    async def close(self) -> list[_Hold]:
        """Stop watching every loading model; returns the holds, whose work is still unsettled."""
        holds, self._holds = list(self._holds.values()), {}
        for hold in holds:
            if hold.task is not None:
                hold.task.cancel()
        await asyncio.gather(*(hold.task for hold in holds if hold.task), return_exceptions=True)
        return holds

    async def _ask(self, model_id: str) -> EnsureModelReadyResponse | None:
        """The worker's answer, recorded in `ReadyModels`; None when the IPC call failed."""
        try:
            response = await self._worker.ensure_model_ready(EnsureModelReadyRequest(model_id=model_id))
        except Exception:  # noqa: BLE001 - an IPC failure is transient: the work is NAKed
            logger.warning("EnsureModelReady(%s) failed", model_id, exc_info=True)
            return None
        self._models.record(model_id, response)
        return response

    async def _proceed(self, model: ReadyModel | None, works: list[Work]) -> None:
        if model is None:
            raise RuntimeError("a ready answer recorded no ready model; this is a bug")
        works = await self._settler.live(works)
        if works:
            await self._out.put((model, works))

    def _hold(self, hold: _Hold, works: Sequence[Work]) -> None:
        now = self._clock()
        for work in works:
            work.held_since = now
        hold.works.extend(works)

    def _start_hold(self, model_id: str, works: list[Work]) -> None:
        hold = _Hold()
        hold.progressed = self._clock()
        self._hold(hold, works)
        self._holds[model_id] = hold
        hold.task = asyncio.get_running_loop().create_task(
            self._poll(model_id, hold), name=f"sie-sidecar-load-{model_id}"
        )

    async def _poll(self, model_id: str, hold: _Hold) -> None:
        try:
            await self._poll_until_settled(model_id, hold)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug here must not strand held work: give it back
            logger.exception("watching the load of %s failed", model_id)
            if self._holds.get(model_id) is hold:
                del self._holds[model_id]
            await self._settler.nak(hold.works, self._options.nak_delay_s)

    async def _poll_until_settled(self, model_id: str, hold: _Hold) -> None:
        """Re-check readiness until the model is ready or the answer settles the held work."""
        while True:
            await asyncio.sleep(self._options.poll_s)  # the load's pace, not the request path
            response = await self._ask(model_id)
            state = response.state if response is not None else MODEL_STATE_LOADING_IN_PROGRESS
            if state in LOADING_STATES:
                await self._keep_holding(hold)
                continue
            if self._holds.get(model_id) is hold:
                del self._holds[model_id]
            if response is not None and state == MODEL_STATE_READY:
                await self._proceed(self._models.get(model_id), hold.works)
            elif response is not None:
                await self._answer(response, hold.works)
            return

    async def _keep_holding(self, hold: _Hold) -> None:
        hold.works = await self._settler.live(hold.works)  # work nobody waits for stops waiting for the load
        now, wall_now = self._clock(), self._wall_clock()
        expired, hold.works = _partition(hold.works, lambda work: self._must_answer(work, now, wall_now))
        if expired:
            await self._settler.reply([(work, model_loading_result(work.item, self._worker_id)) for work in expired])
        if now - hold.progressed >= self._options.progress_s:
            hold.progressed = now
            await self._settler.in_progress(hold.works, now)

    def _must_answer(self, work: Work, now: float, wall_now: float) -> bool:
        """Whether held work must be answered now: its deadline is within ANSWER_MARGIN_S, or (work without a
        deadline, from an older gateway) it was held SIE_SIDECAR_LOAD_HOLD_S."""
        deadline = work.item.deadline
        if deadline is None:
            return now - work.held_since >= self._options.hold_s
        return deadline - wall_now <= ANSWER_MARGIN_S

    async def _answer(self, response: EnsureModelReadyResponse, works: list[Work]) -> None:
        """Settle work the model cannot serve: failed, cooling down, or unknown to this worker. Cooling down
        (retry_later) is a NAK with the worker's delay while the work's deadline allows another attempt; the
        rest is answered with the classified error the client retries on its own."""
        if not works:
            return
        reply = self._reply_for(response)
        if reply is None:
            await self._settler.nak(works, self._options.nak_delay_s)
            return
        if response.state == MODEL_STATE_RETRY_LATER:
            delay_s = max(self._options.nak_delay_s, response.retry_after_s or 0.0)
            latest = self._wall_clock() + delay_s + ANSWER_MARGIN_S
            retried, works = _partition(
                works, lambda work: work.item.deadline is not None and work.item.deadline > latest
            )
            if retried:
                await self._settler.nak(retried, delay_s)
        if works:
            await self._settler.reply([(work, reply(work)) for work in works])

    def _reply_for(self, response: EnsureModelReadyResponse) -> Callable[[Work], WorkResult] | None:
        worker_id = self._worker_id
        if response.state == MODEL_STATE_FAILED:
            return lambda work: load_failed_result(work.item, response, worker_id, permanent=True)
        if response.state != MODEL_STATE_RETRY_LATER or (response.error is None and response.error_class is None):
            return None  # unknown to this worker (or an unknown state): another worker may serve it
        if response.error_class == OOM_ERROR_CLASS:
            return lambda work: resource_exhausted_result(work.item, response, worker_id)
        return lambda work: load_failed_result(work.item, response, worker_id, permanent=False)


def _partition(works: list[Work], chosen: Callable[[Work], bool]) -> tuple[list[Work], list[Work]]:
    """(the works `chosen` says yes to, the others), each in order."""
    yes: list[Work] = []
    no: list[Work] = []
    for work in works:
        (yes if chosen(work) else no).append(work)
    return yes, no
