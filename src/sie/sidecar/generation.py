"""Generation on the sidecar (seed 001 "Generation"; the event contract in sie.wire.generate): generate work is split
off after readiness (never prepared nor batched) and runs as one task per work item. The task calls the worker's
ProcessGenerate with the msgpack WorkItem and obeys its events in order: `publish` sends the packed GenerateChunk to
the gateway's inbox, `ack` flushes and ACKs the delivery (never redelivered from here, so the keepalive stops
progress-ACKing it), `nak` gives it back after the event's delay, `in_progress` progress-ACKs, `done` flushes and
ACKs what is not settled yet. The work keeps its admission slot until its stream ends, so drain waits for it.

Failures: before the ACK the delivery is NAKed (redelivered as a new attempt); after it nobody will retry, so the
gateway gets one terminal chunk (`finish_reason: "error"`, INFERENCE_ERROR) after the last one it saw. A prompt the
gateway offloaded (too large for a broker message) is read back from the payload store first (`PayloadResolver`); a
read that fails ends the stream with a terminal chunk naming why, and ACKs it (another attempt would fail the same way).
`cancel.{router_id}.{request_id}` tombstones the request (a generation still queued here is ACK-dropped by
`Settler.live` before it reaches the worker) and is forwarded through SignalGenerateCancel to a stream running here.
Leaving the sidecar stops every stream: one not yet ACKed is given back (NAK, no delay), one ACKed is cancelled on
the worker and ended with an error chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import attrs

from sie.ipc.client import WorkerClient, close_events
from sie.sidecar.abandonment import Abandonment
from sie.sidecar.payloads import PayloadResolver
from sie.sidecar.settlement import Settler, is_safe_reply_subject
from sie.sidecar.work import Outbox, ReadyGroup, Work
from sie.wire import from_msgpack, to_msgpack
from sie.wire.codes import INFERENCE_ERROR, INTERNAL_ERROR
from sie.wire.generate import (
    EVENT_ACK,
    EVENT_DONE,
    EVENT_IN_PROGRESS,
    EVENT_NAK,
    EVENT_PUBLISH,
    FINISH_ERROR,
    GenerateChunk,
    GenerateEvent,
    ProcessGenerateRequest,
)
from sie.wire.ipc_control import SignalGenerateCancelRequest
from sie.wire.offload import payload_ref
from sie.wire.queue import OPERATION_GENERATE

logger = logging.getLogger(__name__)

# How long one SignalGenerateCancel may take (a cancel is best effort; shutdown must not hang on it).
SIGNAL_TIMEOUT_S: Final = 2.0
FAILED_MESSAGE: Final = "the generation failed on the worker"
STOPPED_MESSAGE: Final = "the worker stopped before the generation finished"


class GenerationFailed(Exception):
    """A stream that cannot go on: the worker named an unsafe reply subject, or its events ended without `done`."""


@attrs.define(eq=False)
class _Stream:
    """One generation work item while its task runs, and how far its stream got."""

    work: Work
    begun: bool = False  # its task started (a task cancelled before that never settles its work itself)
    settled: bool = False  # ACKed or NAKed
    acked: bool = False
    last: GenerateChunk | None = None  # the last chunk published
    subject: str = ""  # where that chunk went
    cancel_pending: bool = False  # a cancel the worker did not match yet (asked again at the next event)

    @property
    def key(self) -> tuple[str, str]:
        return self.work.item.router_id, self.work.item.request_id


class Generations:
    """The generation stage: `start(work)` runs one stream; `on_cancel` hears `cancel.>`; `close()` stops them all.
    `calls` counts ProcessGenerate calls; `payloads` reads offloaded prompts back."""

    def __init__(  # noqa: PLR0913 - the stage's collaborators
        self,
        worker: WorkerClient,
        settler: Settler,
        abandonment: Abandonment,
        worker_id: str,
        nak_delay_s: float,
        payloads: PayloadResolver | None = None,
    ) -> None:
        self._worker = worker
        self._settler = settler
        self._abandonment = abandonment
        self._worker_id = worker_id
        self._nak_delay_s = nak_delay_s
        self._payloads = payloads
        self._streams: dict[_Stream, asyncio.Task[None]] = {}
        self.calls = 0

    @property
    def running(self) -> int:
        """Generations started and not yet ended."""
        return len(self._streams)

    def start(self, work: Work) -> None:
        """Run the generation of `work` in a task of its own (its admission slot bounds how many run)."""
        stream = _Stream(work)
        task = asyncio.get_running_loop().create_task(
            self._run(stream), name=f"sie-sidecar-generate-{work.item.request_id}"
        )
        self._streams[stream] = task
        task.add_done_callback(lambda _: self._streams.pop(stream, None))

    async def on_cancel(self, subject: str, message: Any) -> None:
        """A `cancel.{router_id}.{request_id}` message (the body is ignored): tombstone it and stop the stream of
        that request if it runs here."""
        key = self._abandonment.cancel_generation(subject)
        if key is None:
            return
        for stream in [stream for stream in self._streams if stream.key == key]:
            stream.cancel_pending = not await self._signal(stream)

    async def close(self) -> None:
        """Stop every stream (module docstring); returns once each has settled what it could."""
        streams = dict(self._streams)
        for task in streams.values():
            task.cancel()
        await asyncio.gather(*streams.values(), return_exceptions=True)
        never_begun = [stream.work for stream in streams if not stream.begun]
        if never_begun:
            await self._settler.nak(never_begun, 0.0)

    async def _run(self, stream: _Stream) -> None:
        stream.begun = True
        work = stream.work
        try:
            if await self._settler.live([work]) and await self._inline_prompt(stream):
                await self._stream(stream)
        except asyncio.CancelledError:
            await self._stop(stream)
            raise
        except Exception:  # noqa: BLE001 - any failure settles this one generation; the lane goes on
            logger.warning("the generation of %s failed", work.item.work_item_id, exc_info=True)
            await self._fail(stream)
        finally:
            self._settler.release([work])

    async def _inline_prompt(self, stream: _Stream) -> bool:
        """Whether the work's prompt is in its item: it was, or it is now, read back from the payload store. When
        the read fails the stream is ended (a terminal chunk naming why, then the ACK) and False returned."""
        if payload_ref(stream.work.item) is None:
            return True
        if self._payloads is None:
            failure = (INTERNAL_ERROR, "The prompt was offloaded, but this sidecar reads no payload store")
        else:
            failure = await self._payloads.inline(stream.work)
        if failure is None:
            return True
        code, message = failure
        await self._terminate(stream, message, code)
        await self._ack(stream)
        return False

    async def _stream(self, stream: _Stream) -> None:
        work = stream.work
        request = ProcessGenerateRequest(model_id=work.model_id, work_item_msgpack=to_msgpack(work.item))
        self.calls += 1
        events = self._worker.process_generate(request)
        try:
            async for event in events:
                await self._obey(stream, event)
                if event.kind == EVENT_DONE:
                    return
        finally:
            await _close(events)
        raise GenerationFailed("the worker's events ended without done")

    async def _obey(self, stream: _Stream, event: GenerateEvent) -> None:
        work = stream.work
        if event.kind == EVENT_PUBLISH:
            await self._publish(stream, event)
        elif event.kind == EVENT_ACK:
            await self._ack(stream)
        elif event.kind == EVENT_NAK:
            if not stream.settled:
                await self._settler.nak_stream(work, max(0, event.delay_ms) / 1000.0)
                stream.settled = True
        elif event.kind == EVENT_IN_PROGRESS:
            if not stream.settled:
                await self._settler.in_progress([work], time.monotonic())
        elif event.kind == EVENT_DONE:
            await self._finish(stream)
        else:
            logger.warning("ignoring a generate event of kind %r for %s", event.kind, work.item.work_item_id)
        if stream.cancel_pending:  # the cancel came before the worker knew the request: once more, now it does
            stream.cancel_pending = False
            await self._signal(stream)

    async def _publish(self, stream: _Stream, event: GenerateEvent) -> None:
        subject = event.reply_subject or stream.work.item.reply_subject
        if not is_safe_reply_subject(subject):
            raise GenerationFailed(f"the worker named an unsafe reply subject {subject!r}")
        chunk = from_msgpack(event.payload, GenerateChunk)
        await self._settler.publish_chunk(subject, chunk)
        stream.last, stream.subject = chunk, subject

    async def _ack(self, stream: _Stream) -> None:
        """Flush, then ACK; a failed flush leaves it unacked (`done` tries again)."""
        if not stream.settled and await self._settler.ack_stream(stream.work):
            stream.settled = stream.acked = True

    async def _finish(self, stream: _Stream) -> None:
        if stream.settled:
            await self._settler.flush()
        else:
            await self._ack(stream)

    async def _fail(self, stream: _Stream) -> None:
        await self._signal(stream)  # the worker may still be decoding it
        if stream.last is not None and stream.last.done:  # the answer is complete: only its settlement is left
            await self._finish(stream)
        elif not stream.settled:
            await self._settler.nak_stream(stream.work, self._nak_delay_s)
            stream.settled = True
        elif stream.acked:
            await self._terminate(stream, FAILED_MESSAGE)

    async def _stop(self, stream: _Stream) -> None:
        """The sidecar is stopping: give back what may be retried, end what may not."""
        if stream.last is not None and stream.last.done:
            await self._finish(stream)
            return
        await self._signal(stream)
        if not stream.settled:
            await self._settler.nak_stream(stream.work, 0.0)
            stream.settled = True
        elif stream.acked:
            await self._terminate(stream, STOPPED_MESSAGE)

    async def _terminate(self, stream: _Stream, message: str, code: str = INFERENCE_ERROR) -> None:
        """Publish the terminal error chunk (`code`) after the last chunk of this attempt, then flush."""
        item = stream.work.item
        last = stream.last
        chunk = GenerateChunk(
            request_id=item.request_id,
            work_item_id=item.work_item_id,
            attempt_id=last.attempt_id
            if last is not None
            else f"{item.work_item_id}/{stream.work.delivery.num_delivered}",
            seq=last.seq + 1 if last is not None else 0,
            done=True,
            finish_reason=FINISH_ERROR,
            error=message,
            error_code=code,
            worker_id=self._worker_id,
        )
        try:
            await self._settler.publish_chunk(stream.subject or item.reply_subject, chunk)
        except Exception:  # noqa: BLE001 - the gateway's own timeout answers the client then
            logger.warning("publishing the error chunk of %s failed", item.work_item_id, exc_info=True)
            return
        stream.last = chunk
        await self._settler.flush()

    async def _signal(self, stream: _Stream) -> bool:
        """SignalGenerateCancel for the stream's request; whether a running generation matched."""
        request = SignalGenerateCancelRequest(request_id=stream.work.item.request_id)
        try:
            async with asyncio.timeout(SIGNAL_TIMEOUT_S):
                response = await self._worker.signal_generate_cancel(request)
        except Exception:  # noqa: BLE001 - best effort: the worker may be gone, or never have known it
            logger.debug("SignalGenerateCancel(%s) failed", request.request_id, exc_info=True)
            return False
        return response.matched


class GenerateSplit:
    """Readiness's outbox: each generate work item starts a stream on `generations`, the rest goes on to `rest`
    (preparation)."""

    def __init__(self, generations: Generations, rest: Outbox[ReadyGroup]) -> None:
        self._generations = generations
        self._rest = rest

    async def put(self, group: ReadyGroup) -> None:
        model, works = group
        others: list[Work] = []
        for work in works:
            if work.operation == OPERATION_GENERATE:
                self._generations.start(work)
            else:
                others.append(work)
        if others:
            await self._rest.put((model, others))


async def _close(events: AsyncIterator[GenerateEvent]) -> None:
    """Close the worker's event stream (ends the IPC call), quietly."""
    try:
        await close_events(events)
    except Exception:  # noqa: BLE001 - closing a broken stream must not hide why it broke
        logger.debug("closing a generate stream failed", exc_info=True)


__all__ = ["GenerateSplit", "GenerationFailed", "Generations"]
