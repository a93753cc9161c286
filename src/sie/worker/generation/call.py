"""One ProcessGenerate call as the GenerateEvents the sidecar obeys (`sie.wire.generate`): each text delta of the
sequence a causal LM decodes becomes a published GenerateChunk, the JetStream message is acked right after the
first publish (from then on the stream has begun and is not redelivered), and the terminal chunk carries the
finish reason, token usage and timings. Work with no first token by its deadline is cancelled. The worker service
runs the gates before it (draining, bundle hash, loaded model); this module never touches the model manager.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

from sie.wire import codes, to_msgpack
from sie.wire.generate import (
    EVENT_ACK,
    EVENT_DONE,
    EVENT_IN_PROGRESS,
    EVENT_NAK,
    EVENT_PUBLISH,
    FINISH_ERROR,
    GenerateChunk,
    GenerateEvent,
    GenerationUsage,
)
from sie.wire.queue import WorkItem
from sie.worker.generation.batching_decoder import BatchingDecoder, DecodeEvent, SequenceStream

# Before the first token (a long queue of sequences ahead, a long prompt) the sidecar is told the work is alive
# this often, so that JetStream does not redeliver it.
IN_PROGRESS_EVERY_S: Final = 5.0


def nak_events(delay_ms: int, reason: str | None = None) -> list[GenerateEvent]:
    """Give the message back for redelivery after `delay_ms`; nothing was published."""
    return [GenerateEvent(kind=EVENT_NAK, delay_ms=delay_ms, error=reason), GenerateEvent(kind=EVENT_DONE)]


class GenerationCall:
    """The chunks of one attempt at a work item: numbered from 0 under one attempt id, acked after the first."""

    def __init__(self, item: WorkItem, worker_id: str, started: float) -> None:
        self.item = item
        self.worker_id = worker_id
        self.started = started  # time.perf_counter() when the call arrived: TTFT counts from here
        self.attempt_id = uuid.uuid4().hex
        self.acked = False
        self._seq = 0

    @property
    def chunks(self) -> int:
        """Chunks published so far."""
        return self._seq

    def publish(self, **fields: Any) -> list[GenerateEvent]:
        """One chunk to the reply subject, and the ack when it is the first."""
        chunk = GenerateChunk(
            request_id=self.item.request_id,
            work_item_id=self.item.work_item_id,
            attempt_id=self.attempt_id,
            seq=self._seq,
            worker_id=self.worker_id,
            **fields,
        )
        self._seq += 1
        events = [GenerateEvent(kind=EVENT_PUBLISH, reply_subject=self.item.reply_subject, payload=to_msgpack(chunk))]
        if not self.acked:
            self.acked = True
            events.append(GenerateEvent(kind=EVENT_ACK))
        return events

    def failed(self, message: str, code: str) -> list[GenerateEvent]:
        """A terminal error chunk, the ack if not yet sent, and done."""
        chunk = self.publish(done=True, finish_reason=FINISH_ERROR, error=message, error_code=code)
        return [*chunk, GenerateEvent(kind=EVENT_DONE)]

    def finished(self, event: DecodeEvent, prompt_tokens: int) -> list[GenerateEvent]:
        """The terminal chunk of a sequence that ended (stop, length or cancelled), then done."""
        if event.error is not None:
            return self.failed(event.error, codes.INFERENCE_ERROR)
        usage = GenerationUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=event.completion_tokens,
            total_tokens=prompt_tokens + event.completion_tokens,
        )
        ttft_ms = tpot_ms = None
        if event.first_token_at is not None and event.last_token_at is not None:
            ttft_ms = (event.first_token_at - self.started) * 1000.0
            between = event.sampled_tokens - 1
            tpot_ms = (event.last_token_at - event.first_token_at) * 1000.0 / between if between > 0 else 0.0
        chunk = self.publish(
            text_delta=event.text,
            done=True,
            finish_reason=event.finish_reason,
            usage=usage,
            ttft_ms=ttft_ms,
            tpot_ms=tpot_ms,
        )
        return [*chunk, GenerateEvent(kind=EVENT_DONE)]


async def stream_generation(
    decoder: BatchingDecoder, prompt_tokens: int, stream: SequenceStream, call: GenerationCall
) -> AsyncIterator[GenerateEvent]:
    """The events of a sequence of a `prompt_tokens`-token prompt already started on `decoder` as
    `call.attempt_id`, to its terminal chunk and done. Closed early, it cancels the sequence."""
    deadline = call.item.deadline
    cancelling = False
    ended = False
    try:
        while True:
            try:
                event = await asyncio.wait_for(stream.next(), _wait_seconds(call, deadline, cancelling))
            except TimeoutError:
                if _expired(call, deadline) and not cancelling:
                    cancelling = True  # the sequence ends as cancelled at the next step boundary
                    decoder.cancel_sequence(call.attempt_id)
                elif not call.acked:
                    yield GenerateEvent(kind=EVENT_IN_PROGRESS)
                continue
            if event.done:
                ended = True
                for finishing in call.finished(event, prompt_tokens):
                    yield finishing
                return
            for published in call.publish(text_delta=event.text):
                yield published
    finally:
        if not ended:
            decoder.cancel_sequence(call.attempt_id)


def _expired(call: GenerationCall, deadline: float | None) -> bool:
    """Whether the item's deadline passed before its first chunk went out. The deadline is how long the gateway
    waits for a first chunk; once text streams, the stream lives while its client does (the gateway's cancel ends
    it, and max_tokens bounds it)."""
    return deadline is not None and not call.acked and time.time() >= deadline


def _wait_seconds(call: GenerationCall, deadline: float | None, cancelling: bool) -> float | None:
    """How long to wait for the next event: until the deadline or the next in_progress, both only before the ack."""
    waits = []
    if deadline is not None and not cancelling and not call.acked:
        waits.append(max(0.0, deadline - time.time()))
    if not call.acked:
        waits.append(IN_PROGRESS_EVERY_S)
    return min(waits) if waits else None
