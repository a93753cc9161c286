"""Idempotency-Key handling for config writes (seed 000 §3 "Idempotency", contracts Part A §2.4).

A key's first request (the owner) runs; concurrent requests with the same key wait for it; later ones
get the cached result (an LRU of successes only). Same key with another payload → IdempotencyMismatchError.
An owner cancelled before its commit phase leaves nothing behind: waiters get InflightCancelledError and
a later retry runs afresh. Once the owner has started committing, its outcome is awaited and reported.
Generic over the cached result; knows nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Final, Generic, TypeVar

from sie.control.errors import (
    ControlError,
    IdempotencyMismatchError,
    InflightAbortedError,
    InflightCancelledError,
)

T = TypeVar("T")
DEFAULT_CAPACITY: Final = 1000
MISMATCH_MESSAGE: Final = "Idempotency-Key reused with different payload."

# The owner's work: called with `enter_commit`, which it calls right before irreversible side effects.
Execute = Callable[[Callable[[], None]], Awaitable[T]]


def post_fingerprint(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def put_fingerprint(model_id: str, body: bytes) -> str:
    return hashlib.sha256(b"PUT\0" + model_id.encode() + b"\0" + body).hexdigest()


class _InFlight(Generic[T]):
    """One owner's progress, shared with the waiters on the same key."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.done = asyncio.Event()
        self.committing = False
        self.cancelled = False
        self.error: BaseException | None = None
        self.result: T | None = None

    def enter_commit(self) -> None:
        self.committing = True


async def _finish(task: asyncio.Future[T]) -> None:
    """Wait until `task` is done, absorbing further cancellations of the caller (it re-raises afterwards)."""
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            continue


class IdempotencyCache(Generic[T]):
    """Successful results by key (LRU of `capacity`) and the owners currently running."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._results: OrderedDict[str, tuple[str, T]] = OrderedDict()
        self._inflight: dict[str, _InFlight[T]] = {}

    async def run(self, key: str, fingerprint: str, execute: Execute[T]) -> T:
        """The cached result for `key`, the owner's result after waiting, or `execute`'s own result."""
        cached = self._results.get(key)
        if cached is not None:
            _check(cached[0], fingerprint)
            self._results.move_to_end(key)
            return cached[1]
        record = self._inflight.get(key)
        if record is not None:
            _check(record.fingerprint, fingerprint)
            return await _wait(record)
        record = self._inflight[key] = _InFlight(fingerprint)
        try:
            return await self._own(key, record, execute)
        finally:
            del self._inflight[key]
            record.done.set()

    async def _own(self, key: str, record: _InFlight[T], execute: Execute[T]) -> T:
        task = asyncio.ensure_future(execute(record.enter_commit))
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            await self._on_owner_cancelled(key, record, task)
            raise
        except BaseException as exc:
            record.error = exc
            raise
        self._remember(key, record, result)
        return result

    async def _on_owner_cancelled(self, key: str, record: _InFlight[T], task: asyncio.Future[T]) -> None:
        if not record.committing:
            # Suspended before its commit step: cancelling it now cannot leave a half-applied write.
            task.cancel()
        await _finish(task)  # once committing, the waiters get the real outcome
        if task.cancelled():
            record.cancelled = True
        elif task.exception() is not None:
            record.error = task.exception()
        else:
            self._remember(key, record, task.result())

    def _remember(self, key: str, record: _InFlight[T], result: T) -> None:
        record.result = result
        self._results[key] = (record.fingerprint, result)
        self._results.move_to_end(key)
        while len(self._results) > self._capacity:
            self._results.popitem(last=False)


def _check(stored: str, fingerprint: str) -> None:
    if stored != fingerprint:
        raise IdempotencyMismatchError(MISMATCH_MESSAGE)


async def _wait(record: _InFlight[T]) -> T:
    await record.done.wait()
    if record.cancelled:
        raise InflightCancelledError(
            "The request holding this Idempotency-Key was cancelled before it committed; retry the request."
        )
    if isinstance(record.error, ControlError):
        raise record.error
    if record.error is not None:
        raise InflightAbortedError("The request holding this Idempotency-Key failed; retry the request.")
    return record.result  # type: ignore[return-value]
