"""The sidecar's health publisher (seed 001 "Readiness, Health, And Telemetry"): pings the worker over IPC
every interval and publishes a WorkerHeartbeat on `sie.health.{worker_id}`; its `ready` feeds `/readyz`.
It never raises out of its loop: a failed ping or publish is logged and shows up as "not ready".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, Protocol, Self

import attrs

from sie.catalog.names import health_subject
from sie.ipc.client import WorkerClient
from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from sie.settings import Settings
from sie.transport.base import MessageBus, TransportUnavailable
from sie.wire.health import ModelFailure, WorkerHeartbeat
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
    EnsureModelReadyResponse,
    PingRequest,
    PingResponse,
)

logger = logging.getLogger(__name__)

# A ping or a published heartbeat older than this many intervals makes the sidecar not ready.
FRESH_INTERVALS: Final = 3.0
# A ping slower than this many intervals counts as failed, so a hung worker cannot stall heartbeats.
PING_TIMEOUT_INTERVALS: Final = 2.0
MAX_FAILED_MODELS: Final = 64
UNKNOWN_ERROR_CLASS: Final = "UNKNOWN"


class AcknowledgedConfig(Protocol):
    """The config the sidecar acknowledged after an apply (seed 001 "Live Config"); `""` before any.
    `sie.sidecar.live_config.LiveConfig` owns it; the publisher only reads it."""

    @property
    def bundle_config_hash(self) -> str: ...


@attrs.frozen
class WorkerIdentity:
    """Who the heartbeats speak for: the worker and the lane it serves."""

    worker_id: str
    pool: str
    machine_profile: str
    bundle: str
    device_count: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerIdentity:
        lane = settings.lane
        return cls(settings.process.worker_id, lane.pool, lane.machine_profile, lane.bundle)


def model_failure(response: EnsureModelReadyResponse) -> ModelFailure | None:
    """The failure an EnsureModelReady answer reports: `failed` is permanent, `retry_later` with an error is not."""
    if response.state == MODEL_STATE_FAILED:
        permanent = True
    elif response.state == MODEL_STATE_RETRY_LATER and (response.error or response.error_class):
        permanent = False
    else:
        return None
    return ModelFailure(
        error_class=response.error_class or UNKNOWN_ERROR_CLASS,
        message=response.error or "",
        attempts=response.attempts or 1,
        permanent=permanent,
    )


class HealthPublisher:
    """Heartbeats for one worker. `async with` starts the loop (first beat at once) and stops it on exit.

    Once `acknowledged` holds a non-empty hash it is advertised instead of the worker's own, so a mismatched
    apply stays quarantined. `clock` times freshness; heartbeats carry wall-clock time.
    """

    def __init__(
        self,
        bus: MessageBus,
        worker: WorkerClient,
        identity: WorkerIdentity,
        interval_s: float,
        acknowledged: AcknowledgedConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval_s!r} (SIE_HEALTH_INTERVAL_S)")
        self.bus = bus
        self.worker = worker
        self.identity = identity
        self.interval_s = interval_s
        self.acknowledged = acknowledged
        self.clock = clock
        self.subject = health_subject(identity.worker_id)
        self._ping: PingResponse | None = None
        self._ping_ok_at: float | None = None
        self._published_at: float | None = None
        self._failures: dict[str, ModelFailure] = {}
        self._draining = False
        # A bug in one round must not end heartbeats for good; the interval runs from one round's start to the next.
        outage = Outage("health heartbeat round", logger)
        self._beating = PeriodicTask(self.beat, lambda: self.interval_s, outage, first_run=FirstRun.AT_START,
                                     fixed_rate=True)  # fmt: skip

    @classmethod
    def from_settings(
        cls, bus: MessageBus, worker: WorkerClient, settings: Settings, acknowledged: AcknowledgedConfig | None = None
    ) -> HealthPublisher:
        interval = settings.sidecar.heartbeat_interval_s
        return cls(bus, worker, WorkerIdentity.from_settings(settings), interval, acknowledged)

    async def __aenter__(self) -> Self:
        await self._beating.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._beating.__aexit__(*exc_info)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def ready(self) -> bool:
        """`/readyz`: the last ping succeeded and said ready, it and the last heartbeat are fresh, not draining."""
        if self._draining or self._ping_ok_at is None or self._published_at is None:
            return False
        horizon = self.clock() - FRESH_INTERVALS * self.interval_s
        return self._ping_ok_at >= horizon and self._published_at >= horizon

    @property
    def failed_models(self) -> dict[str, ModelFailure]:
        return dict(self._failures)

    def begin_drain(self) -> None:
        """Advertise draining from now on; the next heartbeat goes out at once."""
        self._draining = True
        self._beating.wake()

    def record_failure(self, model_id: str, failure: ModelFailure) -> None:
        """Report `model_id` as failed to load; the oldest entry goes when more than MAX_FAILED_MODELS are kept."""
        self._failures.pop(model_id, None)
        self._failures[model_id] = failure
        while len(self._failures) > MAX_FAILED_MODELS:
            del self._failures[next(iter(self._failures))]

    def clear_failure(self, model_id: str) -> None:
        self._failures.pop(model_id, None)

    def observe(self, model_id: str, response: EnsureModelReadyResponse) -> None:
        """Record or clear a model's failure from an EnsureModelReady answer the sidecar received."""
        failure = model_failure(response)
        if failure is not None:
            self.record_failure(model_id, failure)
        elif response.state == MODEL_STATE_READY:
            self.clear_failure(model_id)

    async def beat(self) -> WorkerHeartbeat:
        """One round: ping the worker, publish the heartbeat, return it (the loop calls this; tests may too)."""
        ping = await self._ping_worker()
        now = self.clock()
        if ping is not None:
            self._ping = ping
            for model_id in ping.loaded_models:
                self._failures.pop(model_id, None)
        self._ping_ok_at = now if ping is not None and ping.ready else None
        heartbeat = self._heartbeat(ready=ping is not None and ping.ready and not self._draining)
        if await self._publish(heartbeat):
            self._published_at = now
        return heartbeat

    async def _ping_worker(self) -> PingResponse | None:
        request = PingRequest(timestamp_ms=time.time() * 1000.0)
        try:
            async with asyncio.timeout(PING_TIMEOUT_INTERVALS * self.interval_s):
                return await self.worker.ping(request)
        except TimeoutError:
            logger.warning("worker %s did not answer Ping in time", self.identity.worker_id)
        except Exception:  # noqa: BLE001 - any IPC failure means "not ready", never a crash
            logger.warning("Ping to worker %s failed", self.identity.worker_id, exc_info=True)
        return None

    def _advertised_hash(self) -> str:
        acknowledged = self.acknowledged.bundle_config_hash if self.acknowledged is not None else ""
        return acknowledged or (self._ping.bundle_config_hash if self._ping else "")

    def _heartbeat(self, ready: bool) -> WorkerHeartbeat:
        identity, ping = self.identity, self._ping
        return WorkerHeartbeat(
            worker_id=identity.worker_id,
            pool=identity.pool,
            machine_profile=identity.machine_profile,
            bundle=identity.bundle,
            ready=ready,
            timestamp=time.time(),
            bundle_config_hash=self._advertised_hash(),
            loaded_models=list(ping.loaded_models) if ping else [],
            loading_models=list(ping.loading_models) if ping else [],
            failed_models=dict(self._failures),
            draining=self._draining,
            interval_s=self.interval_s,
            device_count=ping.device_count if ping and ping.device_count is not None else identity.device_count,
            residency=list(ping.residency) if ping and ping.residency is not None else None,
        )

    async def _publish(self, heartbeat: WorkerHeartbeat) -> bool:
        try:
            await self.bus.publish(self.subject, heartbeat)
        except TransportUnavailable as exc:  # the transport reports its own outage; one line per beat would repeat it
            logger.debug("heartbeat on %s not published: %s", self.subject, exc)
            return False
        except Exception:  # noqa: BLE001 - a broker outage shows as stale heartbeats (not ready), not a crash
            logger.warning("publishing the heartbeat on %s failed", self.subject, exc_info=True)
            return False
        return True


__all__ = ["FRESH_INTERVALS", "HealthPublisher", "WorkerIdentity", "model_failure"]
