"""A JetStream KV bucket behind `sie.pools.KeyValue` (seed 000 §16.3: pools shared by every gateway replica): the
`SIE_POOLS` bucket by default, history 1, storage and replicas as SIE_STREAM_STORAGE / SIE_STREAM_REPLICAS. It is
bound on first use (created when missing) and bound again after a broker failure; nats-py errors leave as
TransportError subclasses.

nats-py behaviour this relies on (nats/js/kv.py, 2.16): `get` raises KeyNotFoundError for a key never written and
for one deleted or purged; `create` raises KeyWrongLastSequenceError while the key holds a value (over a delete
marker it writes); `update(last=revision)` raises KeyWrongLastSequenceError when the revision moved; `delete(last=)`
writes a delete marker and answers a moved revision with the raw JetStream error 10071; `keys()` raises NoKeysError
on an empty bucket and waits without a deadline, so the listing here is its own, bounded one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final

import nats.errors
import nats.js.errors
from nats.js import api
from nats.js.kv import KeyValue as NatsKeyValue

from sie.pools import KeyValueEntry
from sie.settings import StreamSettings
from sie.transport.base import TransportError
from sie.transport.nats.cache import FOREVER, TtlCache
from sie.transport.nats.connection import API_TIMEOUT_S, Connection
from sie.transport.nats.errors import translated

POOL_BUCKET: Final = "SIE_POOLS"

# JetStream's "wrong last sequence" (10071) and its constant form (10164): a compare-and-set lost.
_WRONG_LAST_SEQUENCE: Final = frozenset({10071, 10164})
_STREAM_NAME_IN_USE: Final = 10058

# The live connection for an action; raises TransportUnavailable when the transport is not open.
ConnectionFor = Callable[[str], Connection]


def key_value_config(bucket: str, settings: StreamSettings) -> api.KeyValueConfig:
    """The configuration a bucket is created with: one revision per key, no bucket-wide TTL (leases expire by
    their own `expires_at`), storage and replicas as the work streams."""
    try:
        storage = api.StorageType(settings.storage)
    except ValueError:
        raise ValueError(
            f"stream storage must be 'memory' or 'file', got {settings.storage!r} (SIE_STREAM_STORAGE)"
        ) from None
    return api.KeyValueConfig(bucket=bucket, history=1, storage=storage, replicas=settings.replicas)


class JetStreamKeyValue:
    """One KV bucket on the connection `connection_for` gives; structurally a `sie.pools.KeyValue`."""

    def __init__(self, connection_for: ConnectionFor, settings: StreamSettings, bucket: str = POOL_BUCKET) -> None:
        self._connection_for = connection_for
        self._settings = settings
        self.bucket = bucket
        self._bound: TtlCache[str, NatsKeyValue] = TtlCache(FOREVER)

    async def get(self, key: str) -> KeyValueEntry | None:
        """The key's value and revision; None when it has none (never written, deleted or purged)."""
        kv = await self._kv(f"read key {key}")
        with self._translated(f"read key {key}"):
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
        return KeyValueEntry(entry.value or b"", entry.revision or 0)

    async def create(self, key: str, value: bytes) -> int | None:
        """Write `value` if the key holds none; its revision, or None when the key holds a value."""
        kv = await self._kv(f"create key {key}")
        with self._translated(f"create key {key}"):
            try:
                return await kv.create(key, value)
            except nats.js.errors.KeyWrongLastSequenceError:
                return None

    async def update(self, key: str, value: bytes, revision: int) -> int | None:
        """Write `value` if the key is still at `revision`; the new revision, or None when it moved."""
        kv = await self._kv(f"update key {key}")
        with self._translated(f"update key {key}"):
            try:
                return await kv.update(key, value, last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                return None

    async def delete(self, key: str, revision: int | None = None) -> bool:
        """Delete the key's value (only at `revision`, when given); False when it had none or its revision moved."""
        if revision is None:
            entry = await self.get(key)
            if entry is None:
                return False
            revision = entry.revision
        kv = await self._kv(f"delete key {key}")
        with self._translated(f"delete key {key}"):
            try:
                await kv.delete(key, last=revision)
            except nats.js.errors.APIError as exc:
                if exc.err_code not in _WRONG_LAST_SEQUENCE:
                    raise
                return False
        return True

    async def keys(self) -> list[str]:
        """Every key that holds a value, each once; TransportUnavailable when the listing takes over API_TIMEOUT_S."""
        kv = await self._kv("list keys")
        with self._translated("list keys"):
            watcher = await kv.watchall(ignore_deletes=True, meta_only=True)
            try:
                async with asyncio.timeout(API_TIMEOUT_S):
                    return list(dict.fromkeys([entry.key async for entry in _current_entries(watcher)]))
            finally:
                await _stop(watcher)

    async def _kv(self, action: str) -> NatsKeyValue:
        connection = self._connection_for(action)
        connection.check_connected(action)
        return await self._bound.get(self.bucket, lambda: self._bind(connection))

    async def _bind(self, connection: Connection) -> NatsKeyValue:
        with translated(f"open key-value bucket {self.bucket}"):
            try:
                return await connection.js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                pass
            try:
                return await connection.js.create_key_value(key_value_config(self.bucket, self._settings))
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != _STREAM_NAME_IN_USE:
                    raise
            # Created meanwhile (by another gateway) with another configuration: use it as it is.
            return await connection.js.key_value(self.bucket)

    @contextlib.contextmanager
    def _translated(self, action: str) -> Iterator[None]:
        """`translated(action)`; a broker failure also unbinds the bucket (it may have been deleted meanwhile)."""
        try:
            with translated(action):
                yield
        except TransportError:
            self._bound.forget(self.bucket)
            raise


async def _current_entries(watcher: NatsKeyValue.KeyWatcher) -> AsyncIterator[NatsKeyValue.Entry]:
    """The watcher's entries up to its "nothing more pending" marker (None)."""
    async for entry in watcher:
        if entry is None:
            return
        yield entry


async def _stop(watcher: NatsKeyValue.KeyWatcher) -> None:
    # A failure means the connection went away, and the watcher's subscription with it.
    with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
        await watcher.stop()
