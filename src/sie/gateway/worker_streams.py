"""The sweep of the direct-dispatch streams of workers that are gone (a crash leftover): each sidecar creates
`WORK_WORKER_{worker}` and its durable `gen-{worker}` (seed 000 §8.2), and a pod scaled down or renamed leaves both on
the broker for good. A gateway deletes such a stream when

- no live worker has its id: the registry heard none with it within its prune time (6 x SIE_GATEWAY_WORKER_STALE_S,
  healthy or not), and the registry is asked only once it has heard its first round of heartbeats;
- it holds no message; and
- it has been idle longer than max_age: its last message (or its creation, if it never had one) is older than the
  longer of its own max_age and SIE_STREAM_MAX_AGE_S. Whatever it held has aged out by then, so nothing is lost.

Every gateway replica sweeps (the `gateway` role only: in process there are no worker streams): a stream another
replica deleted first is skipped, and a stream is deleted only while it is as listed, so a worker of the same name
that came back meanwhile keeps the one it uses. A stream deleted under a live sidecar all the same costs one fetch:
the sidecar creates its stream and consumer again when the broker says they are gone.

Pure asyncio over the transport protocols.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import Final, Self

from sie.catalog.names import work_worker_stream_name
from sie.runtime.periodic import Outage, PeriodicTask
from sie.telemetry.gateway import WorkerStreamMetrics
from sie.transport.base import TransportError, WorkerStream, WorkerStreams

logger = logging.getLogger(__name__)

# A stream must stay idle for max_age (30 min by default) before it goes: sweeping every few minutes keeps up with
# that without asking every replica for the broker's whole stream list often.
SWEEP_INTERVAL_S: Final = 300.0

# The ids of the live workers, or None while they are not all known yet (the sweep then waits for its next turn).
LiveWorkers = Callable[[], Collection[str] | None]


def stale_worker_streams(
    streams: Iterable[WorkerStream], live_workers: Collection[str], max_age_s: float, now: float
) -> list[WorkerStream]:
    """The streams a sweep deletes at `now` (epoch seconds): of no worker in `live_workers`, empty, and idle for
    longer than the longer of their own max_age and `max_age_s` (SIE_STREAM_MAX_AGE_S)."""
    live = {work_worker_stream_name(worker) for worker in live_workers if worker.strip()}
    return [
        stream
        for stream in streams
        if stream.name not in live and not stream.messages and now - stream.active_at > max(stream.max_age_s, max_age_s)
    ]


class WorkerStreamSweep:
    """Sweeps the streams of workers that are gone (see the module docstring) every `interval_s` inside `async with`,
    the first time one interval after entry. `live_workers()` names the live workers; `clock` is epoch seconds, as the
    broker stamps its streams. `swept` counts the streams this gateway deleted."""

    def __init__(
        self,
        streams: WorkerStreams,
        live_workers: LiveWorkers,
        max_age_s: float,
        *,
        interval_s: float = SWEEP_INTERVAL_S,
        clock: Callable[[], float] = time.time,
        metrics: WorkerStreamMetrics | None = None,
    ) -> None:
        self._streams = streams
        self._live_workers = live_workers
        self._max_age_s = max_age_s
        self._clock = clock
        self._metrics = metrics
        self.swept = 0
        outage = Outage("sweeping the direct-dispatch streams of workers that are gone", logger, (TransportError,))
        self._sweeping = PeriodicTask(self.sweep, interval_s, outage)

    async def __aenter__(self) -> Self:
        await self._sweeping.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._sweeping.__aexit__(*exc_info)

    async def sweep(self) -> list[WorkerStream]:
        """One sweep; returns the streams this gateway deleted (none while the live workers are not all known)."""
        listed = await self._streams.worker_streams()
        live = self._live_workers()  # asked after the listing: a worker heard from meanwhile counts as live
        if live is None:
            logger.debug("not sweeping worker streams: the live workers are not all known yet")
            return []
        now = self._clock()
        deleted = []
        for stream in stale_worker_streams(listed, live, self._max_age_s, now):
            if await self._streams.delete_worker_stream(stream):
                deleted.append(stream)
                logger.info("deleted the direct-dispatch stream %s of a worker that is gone: empty, idle for %.0f s",
                            stream.name, now - stream.active_at)  # fmt: skip
        self.swept += len(deleted)
        if self._metrics is not None and deleted:
            self._metrics.swept(len(deleted))
        return deleted
