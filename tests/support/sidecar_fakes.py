"""Fakes at the sidecar's seams: a JetStream-like delivery that records its settlement calls, for the sidecar's unit
tests (the transport is the seam there; integration tests use the real loopback and NATS transports), and a worker
whose ProcessGenerate plays a script (the worker is the seam of the generation stage)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs

from sie.wire import from_msgpack, to_msgpack
from sie.wire.generate import (
    EVENT_ACK,
    EVENT_DONE,
    EVENT_IN_PROGRESS,
    EVENT_NAK,
    EVENT_PUBLISH,
    GenerateChunk,
    GenerateEvent,
    ProcessGenerateRequest,
)
from sie.wire.ipc_control import (
    MODEL_STATE_READY,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelDescriptor,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
)
from sie.wire.queue import WorkItem

WORK_SUBJECT = "sie.work.default.default.default.m"


class RecordingDelivery:
    """Appends `("ack"|"nak"|"in_progress"|"term", work_item_id[, delay])` to `log`."""

    def __init__(self, item: WorkItem, log: list, subject: str = WORK_SUBJECT) -> None:
        self.item = item
        self.subject = subject
        self.num_delivered = 1
        self._log = log

    async def ack(self) -> None:
        self._log.append(("ack", self.item.work_item_id))

    async def nak(self, delay_s: float = 0.0) -> None:
        self._log.append(("nak", self.item.work_item_id, delay_s))

    async def in_progress(self) -> None:
        self._log.append(("in_progress", self.item.work_item_id))

    async def term(self) -> None:
        self._log.append(("term", self.item.work_item_id))


# --- generation -----------------------------------------------------------------------------------
# A worker whose ProcessGenerate plays a script of steps (the worker behind the sidecar is the seam there).


@attrs.frozen
class Publish:
    """A `publish` event carrying the next chunk of the attempt (seq counts from 0); `reply_subject` overrides
    the item's."""

    text: str = ""
    done: bool = False
    finish_reason: str | None = None
    reply_subject: str = ""


@attrs.frozen
class Sleep:
    seconds: float


@attrs.frozen
class Wait:
    """Wait for `event` (a test's gate) before the next step."""

    event: asyncio.Event


@attrs.frozen
class UntilCancelled:
    """Wait until SignalGenerateCancel names this request."""


@attrs.frozen
class Fail:
    """The IPC call fails here (raised from the event stream)."""

    message: str = "the worker connection dropped"


ACK = GenerateEvent(kind=EVENT_ACK)
DONE = GenerateEvent(kind=EVENT_DONE)
IN_PROGRESS = GenerateEvent(kind=EVENT_IN_PROGRESS)


def nak(delay_ms: int) -> GenerateEvent:
    return GenerateEvent(kind=EVENT_NAK, delay_ms=delay_ms)


Step = Publish | Sleep | Wait | UntilCancelled | Fail | GenerateEvent
Script = Callable[[WorkItem, int], list[Step]]  # (the item, which call for its request: 1, 2, …) → steps

READY = EnsureModelReadyResponse(state=MODEL_STATE_READY, batch_budget=64, descriptor=ModelDescriptor())


class ScriptedGenerateWorker:
    """A WorkerClient whose ProcessGenerate plays `script(item, call)`: chunks get seq 0, 1, … and the attempt id
    `{work_item_id}/{call}`. `calls` lists the items it was asked to generate, `cancels` the request ids
    SignalGenerateCancel named (matched while that request's stream runs). Every other call goes to `inner` (the
    null backend, say); without one, every model is ready."""

    def __init__(self, script: Script, inner: Any = None) -> None:
        self.script = script
        self.inner = inner
        self.calls: list[WorkItem] = []
        self.cancels: list[str] = []
        self.running: dict[str, asyncio.Event] = {}

    def calls_of(self, request_id: str) -> int:
        return sum(1 for item in self.calls if item.request_id == request_id)

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        if self.inner is not None:
            return await self.inner.ensure_model_ready(request)
        return READY

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        item = from_msgpack(request.work_item_msgpack, WorkItem)
        assert item.model_id == request.model_id
        self.calls.append(item)
        call = self.calls_of(item.request_id)
        cancelled = self.running[item.request_id] = asyncio.Event()
        seq = 0
        try:
            for step in self.script(item, call):
                if isinstance(step, Publish):
                    chunk = GenerateChunk(
                        request_id=item.request_id, work_item_id=item.work_item_id,
                        attempt_id=f"{item.work_item_id}/{call}", seq=seq, text_delta=step.text, done=step.done,
                        finish_reason=step.finish_reason,
                    )  # fmt: skip
                    seq += 1
                    yield GenerateEvent(kind=EVENT_PUBLISH, reply_subject=step.reply_subject, payload=to_msgpack(chunk))
                elif isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, Wait):
                    await step.event.wait()
                elif isinstance(step, UntilCancelled):
                    await cancelled.wait()
                elif isinstance(step, Fail):
                    raise ConnectionError(step.message)
                else:
                    yield step
        finally:
            self.running.pop(item.request_id, None)

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        self.cancels.append(request.request_id)
        cancelled = self.running.get(request.request_id)
        if cancelled is not None:
            cancelled.set()
        return SignalGenerateCancelResponse(matched=cancelled is not None)

    def __getattr__(self, name: str) -> Any:
        if self.inner is None:
            raise AttributeError(name)
        return getattr(self.inner, name)
