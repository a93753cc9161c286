"""Pool streams and lane consumers on the broker (seed 000 §8.2): `WORK_POOL_{pool}` is created by whoever
needs it first and reconciled when it exists (subjects, max_age, discard, replicas; never storage), and each
lane gets its durable, filtered, explicit-ack consumer. A worker's direct-dispatch stream `WORK_WORKER_{worker}`
(its lane's subjects with the worker token after the model) and its durable `gen-{worker}` are configured,
created and reconciled the same way, by the worker's sidecar only. Results are cached, so each is ensured once
per process.

Control plane only: no publishing, no fetching.
"""

from __future__ import annotations

import dataclasses
import logging

import nats.js.errors
from nats.js import api

from sie.catalog.names import (
    lane_filter_subject,
    work_consumer_name,
    work_pool_stream_name,
    work_pool_stream_subjects,
    work_worker_consumer_name,
    work_worker_stream_name,
    work_worker_stream_subjects,
)
from sie.settings import StreamSettings
from sie.transport.base import Lane, LaneDepth, TransportError, TransportUnavailable
from sie.transport.nats.cache import FOREVER, TtlCache
from sie.transport.nats.connection import Connection
from sie.transport.nats.errors import translated

logger = logging.getLogger(__name__)

# In-flight deliveries a lane consumer allows across all its fetchers: above any one sidecar's batch
# capacity times a few dozen sidecars, low enough that a stuck lane stops pulling instead of hoarding.
MAX_ACK_PENDING = 10_000
# JetStream refuses a duplicate window longer than max_age; two minutes is its own default.
DEFAULT_DUPLICATE_WINDOW_S = 120.0
_STREAM_NAME_IN_USE = 10058  # "stream name already in use with a different configuration"

_STORAGE = {"memory": api.StorageType.MEMORY, "file": api.StorageType.FILE}


def stream_config(pool: str, settings: StreamSettings) -> api.StreamConfig:
    """The configuration `WORK_POOL_{pool}` is created with."""
    return _work_stream_config(work_pool_stream_name(pool), work_pool_stream_subjects(pool), settings)


def worker_stream_config(lane: Lane, worker_id: str, settings: StreamSettings) -> api.StreamConfig:
    """The configuration `WORK_WORKER_{worker}` is created with: a pool stream's, capturing the worker's subjects."""
    subjects = work_worker_stream_subjects(lane.pool, lane.machine_profile, lane.bundle, worker_id)
    return _work_stream_config(work_worker_stream_name(worker_id), subjects, settings)


def _work_stream_config(name: str, subjects: list[str], settings: StreamSettings) -> api.StreamConfig:
    storage = _STORAGE.get(settings.storage)
    if storage is None:
        raise ValueError(f"stream storage must be 'memory' or 'file', got {settings.storage!r} (SIE_STREAM_STORAGE)")
    return api.StreamConfig(
        name=name,
        subjects=subjects,
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=storage,
        num_replicas=settings.replicas,
        max_age=settings.max_age_s,
        max_msgs=settings.max_msgs,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=min(DEFAULT_DUPLICATE_WINDOW_S, settings.max_age_s),
    )


def consumer_config(lane: Lane, settings: StreamSettings) -> api.ConsumerConfig:
    """The durable pull consumer of one lane: filtered to its profile and bundle, explicit ack."""
    name = work_consumer_name(lane.pool, lane.machine_profile, lane.bundle)
    return _pull_consumer_config(name, lane_filter_subject(lane.pool, lane.machine_profile, lane.bundle), settings)


def worker_consumer_config(lane: Lane, worker_id: str, settings: StreamSettings) -> api.ConsumerConfig:
    """The durable pull consumer of a worker's direct-dispatch stream, `gen-{worker}`: configured as a lane's."""
    (subject,) = work_worker_stream_subjects(lane.pool, lane.machine_profile, lane.bundle, worker_id)
    return _pull_consumer_config(work_worker_consumer_name(worker_id), subject, settings)


def _pull_consumer_config(name: str, filter_subject: str, settings: StreamSettings) -> api.ConsumerConfig:
    return api.ConsumerConfig(
        name=name,
        durable_name=name,
        filter_subject=filter_subject,
        deliver_policy=api.DeliverPolicy.ALL,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait_s,
        max_deliver=settings.max_deliver,
        max_ack_pending=MAX_ACK_PENDING,
    )


def reconciled(existing: api.StreamConfig, wanted: api.StreamConfig) -> api.StreamConfig | None:
    """`existing` with subjects, max_age, discard and replicas set as `wanted`; None when nothing differs.

    Storage is never changed (JetStream refuses it, err_code 10052, and recreating the stream would
    destroy the queued work); a mismatch is only logged."""
    if existing.storage != wanted.storage:
        logger.warning(
            "stream %s uses %s storage but settings ask for %s; leaving it (drain the pool and recreate the "
            "stream to change it)",
            existing.name, _value(existing.storage), _value(wanted.storage),
        )  # fmt: skip
    changes = {
        field: getattr(wanted, field)
        for field in ("subjects", "max_age", "discard", "num_replicas")
        if _value(getattr(existing, field)) != _value(getattr(wanted, field))
    }
    if not changes:
        return None
    if "max_age" in changes and wanted.max_age and (existing.duplicate_window or 0) > wanted.max_age:
        changes["duplicate_window"] = wanted.max_age
    return dataclasses.replace(existing, **changes)


class StreamRegistry:
    """Ensures pool streams, lane consumers and workers' direct-dispatch streams and consumers once per process
    (shared in-flight ensures, cached results)."""

    def __init__(self, connection: Connection, settings: StreamSettings) -> None:
        self._connection = connection
        self._settings = settings
        self._streams: TtlCache[str, None] = TtlCache(FOREVER)
        self._consumers: TtlCache[Lane, str] = TtlCache(FOREVER)
        self._worker_consumers: TtlCache[tuple[Lane, str], str] = TtlCache(FOREVER)

    async def ensure_stream(self, pool: str) -> str:
        """Create or reconcile `WORK_POOL_{pool}`; returns its name."""
        await self._streams.get(pool, lambda: self._ensure_stream(pool))
        return work_pool_stream_name(pool)

    def forget_stream(self, pool: str) -> None:
        """The stream vanished (deleted by an operator): ensure it again next time."""
        self._streams.forget(pool)
        for lane in self._consumers.cached_keys():
            if lane.pool == pool:
                self._consumers.forget(lane)

    async def ensure_consumer(self, lane: Lane) -> str:
        """Create (or update to the settings) the lane's durable consumer; returns its name."""
        await self.ensure_stream(lane.pool)
        return await self._consumers.get(lane, lambda: self._ensure_consumer(lane))

    async def reattach(self, lane: Lane) -> None:
        """The lane's consumer is gone from the broker: ensure its stream and consumer again."""
        self.forget_stream(lane.pool)
        await self.ensure_consumer(lane)

    async def ensure_worker_consumer(self, lane: Lane, worker_id: str) -> str:
        """Create or reconcile `WORK_WORKER_{worker}` for `lane`, and create (or update to the settings) its durable
        `gen-{worker}`; returns the consumer's name."""
        return await self._worker_consumers.get((lane, worker_id), lambda: self._ensure_worker(lane, worker_id))

    async def reattach_worker(self, lane: Lane, worker_id: str) -> None:
        """The worker's direct-dispatch consumer is gone from the broker (or its stream): ensure both again."""
        self._worker_consumers.forget((lane, worker_id))
        await self.ensure_worker_consumer(lane, worker_id)

    async def consumer_exists(self, lane: Lane) -> bool:
        """Whether the lane's durable consumer exists on the broker (False when its stream does not either)."""
        name = work_consumer_name(lane.pool, lane.machine_profile, lane.bundle)
        self._connection.check_connected(f"consumer info {name}")
        with translated(f"consumer info {name}"):
            try:
                await self._connection.jsm.consumer_info(work_pool_stream_name(lane.pool), name)
            except nats.js.errors.NotFoundError:
                return False
        return True

    async def consumer_depth(self, lane: Lane) -> LaneDepth:
        """The lane consumer's num_pending and num_ack_pending; zeros when it or its stream does not exist."""
        name = work_consumer_name(lane.pool, lane.machine_profile, lane.bundle)
        self._connection.check_connected(f"consumer info {name}")
        with translated(f"consumer info {name}"):
            try:
                info = await self._connection.jsm.consumer_info(work_pool_stream_name(lane.pool), name)
            except nats.js.errors.NotFoundError:
                return LaneDepth()
        return LaneDepth(info.num_pending or 0, info.num_ack_pending or 0)

    async def _ensure_stream(self, pool: str) -> None:
        await self._ensure_work_stream(stream_config(pool, self._settings))

    async def _ensure_worker(self, lane: Lane, worker_id: str) -> str:
        stream = worker_stream_config(lane, worker_id, self._settings)
        await self._ensure_work_stream(stream)
        return await self._add_consumer(str(stream.name), worker_consumer_config(lane, worker_id, self._settings))

    async def _ensure_work_stream(self, wanted: api.StreamConfig) -> None:
        self._connection.check_connected(f"ensure stream {wanted.name}")
        with translated(f"ensure stream {wanted.name}"):
            try:
                await self._connection.jsm.add_stream(wanted)
                return
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != _STREAM_NAME_IN_USE:
                    raise
            info = await self._connection.jsm.stream_info(wanted.name)
        update = reconciled(info.config, wanted)
        if update is not None:
            await self._update(update)

    async def _update(self, update: api.StreamConfig) -> None:
        logger.info("reconciling stream %s: subjects/max_age/discard/replicas as the settings say", update.name)
        try:
            with translated(f"reconcile stream {update.name}"):
                await self._connection.jsm.update_stream(update)
        except TransportUnavailable:
            raise
        except TransportError as exc:
            # The stream works as it is (say R3 asked of a single server, err_code 10074): keep serving.
            logger.warning("stream %s left as it is: %s", update.name, exc)

    async def _ensure_consumer(self, lane: Lane) -> str:
        return await self._add_consumer(work_pool_stream_name(lane.pool), consumer_config(lane, self._settings))

    async def _add_consumer(self, stream: str, config: api.ConsumerConfig) -> str:
        self._connection.check_connected(f"ensure consumer {config.name}")
        with translated(f"ensure consumer {config.name} on {stream}"):
            # Create-or-update: a durable left by other settings takes this process's ack_wait and max_deliver.
            await self._connection.jsm.add_consumer(stream, config)
        return str(config.name)


def _value(setting: object) -> object:
    """Enum members compare by value with the strings a server config carries."""
    return getattr(setting, "value", setting)
