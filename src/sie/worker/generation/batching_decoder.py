"""Continuous batching of decoder sequences (DESIGN §7): a thread of each loaded causal LM, running while it has
sequences, runs each decode step over every running sequence at once. New sequences join between two steps: their
prompts are prefilled together (left-padded to the longest, in groups of at most PREFILL_TOKENS padded tokens) and
their key/value cache joins the batch's (`kv_cache.BatchCache`: left-padded on the time axis, with a mask of the real
positions); a finished or cancelled sequence leaves the same way. Each row picks tokens with its own Sampler and ends
by its own StopChecker (`sampling`, `stopping`); its events reach the event loop through `call_soon_threadsafe`. On
the event loop only `submit`, `cancel`, `close` and `SequenceStream.next` run, and none of them waits for a decode
step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import numpy as np

from sie.wire.generate import FINISH_CANCELLED, FINISH_ERROR
from sie.worker.convert.names import ATTENTION_MASK
from sie.worker.generation.decoder_run import DecoderRun
from sie.worker.generation.kv_cache import BatchCache, CacheShape, bytes_per_cached_token, bytes_per_row_state
from sie.worker.generation.sampling import Sampler, SamplingParams
from sie.worker.generation.stopping import StopChecker, TokenDecoder

logger = logging.getLogger(__name__)

DEFAULT_MAX_SEQUENCES: Final = 16
DEFAULT_CACHE_BYTES: Final = 2 * 1024**3
# Padded prompt tokens (rows × longest prompt) one prefill run may take; a longer prompt runs alone.
PREFILL_TOKENS: Final = 2048


@attrs.frozen
class DecoderLimits:
    """How much one model's decode loop may hold: rows decoded together (SIE_GENERATION_MAX_SEQUENCES) and bytes of
    key/value cache (SIE_GENERATION_CACHE_BYTES).

    The cache bound holds for the whole life of the batch: a row never spans more than its prompt plus its
    max_tokens, so the left-padded batch is never longer than the longest such span among its rows, and a sequence
    joins only while rows × that span × bytes per cached token stays within `cache_bytes`. A sequence alone in the
    batch always runs (its own bound is the model's context length).
    """

    max_sequences: int = DEFAULT_MAX_SEQUENCES
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def __attrs_post_init__(self) -> None:
        if self.max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1, got {self.max_sequences}")
        if self.cache_bytes < 1:
            raise ValueError(f"cache_bytes must be >= 1, got {self.cache_bytes}")


@attrs.frozen
class DecodeEvent:
    """What one sequence's reader receives: new text; the last event also says why it ended (`finish_reason`),
    the tokens it made (`completion_tokens`: stop token excluded; `sampled_tokens`: included) and when its first
    and last tokens were sampled (`time.perf_counter()`)."""

    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    sampled_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class SequenceStream:
    """One sequence's events, read on the event loop that submitted it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, maxsize: int) -> None:
        self._loop = loop
        # At most one event per sampled token, the last one included: the bound is never reached.
        self._queue: asyncio.Queue[DecodeEvent] = asyncio.Queue(maxsize)

    async def next(self) -> DecodeEvent:
        return await self._queue.get()

    def deliver(self, event: DecodeEvent) -> None:
        """Hand `event` to the reader's loop (from any thread)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody reads this sequence any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)


@attrs.define(eq=False)
class _Sequence:
    sequence_id: str
    request_id: str
    prompt_ids: np.ndarray
    sampler: Sampler
    stop: StopChecker
    stream: SequenceStream
    forget: Callable[[str], None]  # the engine stops counting it as running (before its last event is out)
    span: int = 0  # the most cache columns it can ever need: its prompt plus its max_tokens
    last_token: int = -1
    first_token_at: float | None = None
    last_token_at: float | None = None
    ended: bool = False

    def take(self, logits: np.ndarray) -> bool:
        """Sample the next token from `logits`, deliver the text it releases; True when the sequence ended."""
        token = self.sampler.next_token(logits)
        self.last_token_at = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        self.last_token = token
        step = self.stop.push(token)
        if step.finish_reason is not None:
            self.end(step.finish_reason, step.text)
            return True
        if step.text:
            self.stream.deliver(DecodeEvent(step.text))
        return False

    def end(self, finish_reason: str, text: str = "", error: str | None = None) -> None:
        """Deliver the last event (once; a later call does nothing)."""
        if self.ended:
            return
        self.ended = True
        self.forget(self.sequence_id)
        tokens = len(self.stop.token_ids)
        first, last = self.first_token_at, self.last_token_at
        self.stream.deliver(DecodeEvent(text, finish_reason, tokens, self.stop.steps, first, last, error))


class BatchingDecoder:
    """Decodes sequences together on a thread of its own, as many as `limits` allow, which runs while there are
    sequences and ends when there are none (the next `submit` starts another).

    `session` runs the converted decoder graph; `decode` maps generated ids to text (for the StopCheckers).
    """

    def __init__(
        self,
        session: Any,
        shape: CacheShape,
        decode: TokenDecoder,
        limits: DecoderLimits | None = None,
        name: str = "decoder",
    ) -> None:
        self._run_graph = DecoderRun(session)
        self._shape = shape
        self._decode = decode
        self._limits = limits or DecoderLimits()
        self._token_bytes = bytes_per_cached_token(shape)
        self._row_bytes = bytes_per_row_state(shape)
        self._name = name
        self._lock = threading.RLock()  # re-entered when a sequence ends while the lock is held
        # Shared with the event loop, under `_lock`: sequences not yet admitted, those the thread decodes (its
        # rows, plus ones it is admitting), running ones to drop at the next step boundary, whether to end every
        # running one (close), and the thread while it runs.
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}
        self._cancelled: set[str] = set()
        self._aborting = False
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> int:
        """Sequences being decoded (admitted and not yet ended)."""
        with self._lock:
            return len(self._running)

    @property
    def waiting(self) -> int:
        """Sequences submitted and waiting for a free row."""
        with self._lock:
            return len(self._waiting)

    @property
    def running_thread(self) -> threading.Thread | None:
        """The decode thread while there is work, else None."""
        with self._lock:
            return self._thread

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str, sequence_id: str
    ) -> SequenceStream:
        """Queue one sequence (call on the event loop that reads it); its events arrive on the returned stream,
        the last one `done`. `sequence_id` is unique per sequence; `request_id` is what `cancel` matches."""
        stream = SequenceStream(asyncio.get_running_loop(), params.max_tokens + 1)
        ids = np.asarray(prompt_ids, dtype=np.int64)
        stop = StopChecker(params, self._decode)
        span = len(ids) + params.max_tokens
        sequence = _Sequence(sequence_id, request_id, ids, Sampler(params), stop, stream, self._forget, span)
        with self._lock:
            self._waiting.append(sequence)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"decode:{self._name}", daemon=True)
                self._thread.start()
        return stream

    def cancel(self, request_id: str) -> bool:
        """End every sequence of `request_id` as cancelled (its rows leave before the next step); False when
        none is waiting or running."""
        return self._cancel(lambda sequence: sequence.request_id == request_id)

    def cancel_sequence(self, sequence_id: str) -> bool:
        """`cancel` for the one sequence submitted as `sequence_id`."""
        return self._cancel(lambda sequence: sequence.sequence_id == sequence_id)

    def close(self, timeout: float | None = None) -> None:
        """End every sequence now with an error (the model is unloaded); the thread stops after its current step.
        Waits up to `timeout` seconds for it (None: not at all, for callers on the event loop)."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            self._aborting = self._thread is not None
            thread = self._thread
        for sequence in waiting:
            sequence.end(FINISH_ERROR, error=f"{self._name} was unloaded")
        if thread is not None and timeout is not None:
            thread.join(timeout)

    def _cancel(self, matches: Callable[[_Sequence], bool]) -> bool:
        with self._lock:
            waiting = [sequence for sequence in self._waiting if matches(sequence)]
            for sequence in waiting:
                self._waiting.remove(sequence)
                sequence.end(FINISH_CANCELLED)
            running = [key for key, sequence in self._running.items() if matches(sequence)]
            self._cancelled.update(running)
            return bool(waiting or running)

    # The decode thread.

    def _run(self) -> None:
        rows: list[_Sequence] = []
        batch = BatchCache.empty(self._shape)
        while True:
            leaving, aborting = self._signals()
            if aborting:
                for sequence in rows:
                    sequence.end(FINISH_ERROR, error=f"{self._name} was unloaded")
                rows, batch = [], BatchCache.empty(self._shape)
            rows, batch = self._drop(rows, batch, leaving)
            joining = self._admit(rows)
            if joining is None:
                return
            for group in prefill_groups(joining):
                started, cache = self._prefill(group)
                if started:
                    rows.extend(started)
                    batch = batch.join(cache)
            if rows:
                rows, batch = self._step(rows, batch)

    def _signals(self) -> tuple[set[str], bool]:
        """The running rows cancelled since the last step, and whether `close` asked to end them all."""
        with self._lock:
            leaving, self._cancelled = self._cancelled, set()
            aborting, self._aborting = self._aborting, False
            return leaving, aborting

    def _admit(self, rows: list[_Sequence]) -> list[_Sequence] | None:
        """The waiting sequences that may join `rows`, in arrival order, within the limits (`DecoderLimits`); None
        when there is no work at all, and then the thread ends (decided under the lock, so a `submit` from now on
        starts the next one)."""
        with self._lock:
            if not rows and not self._waiting:
                self._thread = None
                self._running.clear()
                self._cancelled.clear()
                self._aborting = False
                return None
            joining: list[_Sequence] = []
            count, span = len(rows), max((row.span for row in rows), default=0)
            while self._waiting and count < self._limits.max_sequences:
                candidate = self._waiting[0]
                wider = max(span, candidate.span)
                if count and (count + 1) * (wider * self._token_bytes + self._row_bytes) > self._limits.cache_bytes:
                    break  # it waits for rows to leave; the ones behind it wait too (arrival order)
                joining.append(self._waiting.popleft())
                count, span = count + 1, wider
            self._running.update((sequence.sequence_id, sequence) for sequence in joining)
            return joining

    def _forget(self, sequence_id: str) -> None:
        with self._lock:
            self._running.pop(sequence_id, None)

    @staticmethod
    def _drop(rows: list[_Sequence], batch: BatchCache, leaving: set[str]) -> tuple[list[_Sequence], BatchCache]:
        if not leaving or not rows:
            return rows, batch
        kept = [index for index, sequence in enumerate(rows) if sequence.sequence_id not in leaving]
        for sequence in rows:
            if sequence.sequence_id in leaving:
                sequence.end(FINISH_CANCELLED)
        return [rows[index] for index in kept], batch.keep(kept)

    def _prefill(self, sequences: list[_Sequence]) -> tuple[list[_Sequence], BatchCache]:
        """Run the prompts together and sample each one's first token; the sequences still going, and their cache."""
        feeds = BatchCache.prompt_feeds([sequence.prompt_ids for sequence in sequences], self._shape)
        try:
            logits, present = self._run_graph(feeds)
            kept = [row for row, sequence in enumerate(sequences) if not sequence.take(logits[row, -1])]
        except Exception as exc:  # noqa: BLE001 - a failed prefill ends its sequences, never the thread
            self._fail(sequences, exc)
            return [], BatchCache.empty(self._shape)
        cache = BatchCache(present, feeds[ATTENTION_MASK])
        if len(kept) < len(sequences):
            cache = cache.keep(kept)
        return [sequences[row] for row in kept], cache

    def _step(self, rows: list[_Sequence], batch: BatchCache) -> tuple[list[_Sequence], BatchCache]:
        """One decode step over every row; rows whose sequence ended leave the batch."""
        try:
            logits, present = self._run_graph(batch.step_feeds([sequence.last_token for sequence in rows]))
            batch = batch.advanced(present)
            kept = [index for index, sequence in enumerate(rows) if not sequence.take(logits[index, -1])]
        except Exception as exc:  # noqa: BLE001 - a failed step ends the batch's sequences, never the thread
            self._fail(rows, exc)
            return [], BatchCache.empty(self._shape)
        if len(kept) == len(rows):
            return rows, batch
        return [rows[index] for index in kept], batch.keep(kept)

    def _fail(self, sequences: list[_Sequence], exc: Exception) -> None:
        logger.exception("decoding on %s failed for %d sequences", self._name, len(sequences), exc_info=exc)
        for sequence in sequences:
            sequence.end(FINISH_ERROR, error=f"decoding failed ({type(exc).__name__}); the worker log has the details")


def prefill_groups(sequences: Sequence[_Sequence], budget: int = PREFILL_TOKENS) -> list[list[_Sequence]]:
    """`sequences` in arrival order, cut into groups whose padded size (rows × longest prompt) stays within `budget`
    (a prompt longer than that is a group of its own)."""
    groups: list[list[_Sequence]] = []
    group: list[_Sequence] = []
    width = 0
    for sequence in sequences:
        length = len(sequence.prompt_ids)
        if group and (len(group) + 1) * max(width, length) > budget:
            groups.append(group)
            group, width = [], 0
        group.append(sequence)
        width = max(width, length)
    if group:
        groups.append(group)
    return groups
