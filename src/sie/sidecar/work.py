"""What travels through the sidecar's stages and what carries it: one `Work` per delivery, filled in as it
moves (admitted, prepared, batched), the `ReadyModel` a ready worker described, and the bounded `Channel`
that hands groups of work from one stage to the next. No stage logic lives here.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, Protocol, TypeVar

import attrs

from sie.transport.base import Delivery
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.queue import WorkItem


class Work:
    """One delivered work item on its way through the sidecar (one object per delivery, no copies)."""

    __slots__ = (
        "admitted",
        "cost",
        "delivery",
        "held_since",
        "item",
        "lora_key",
        "model_id",
        "prep_ms",
        "prepared",
        "progressed",
        "received",
        "run_item",
        "verified_hash",
    )

    def __init__(self, delivery: Delivery, received: float) -> None:
        self.delivery = delivery
        self.item: WorkItem = delivery.item
        self.model_id: str = self.item.model_id
        # Monotonic times: when it was fetched, last progress-ACKed, (while its model loads) held, and (stamped only
        # while tracing) prepared, where its batch wait starts.
        self.received = received
        self.progressed = received
        self.held_since = received
        self.prepared = received
        self.admitted = False
        # Set by preparation: the batch cost, the IPC item, the sidecar's tokenization time.
        self.cost = 1
        self.lora_key = lora_key_of(self.item.options)
        self.run_item: Any = None
        self.prep_ms = 0.0
        # Set by the hash gate: the item's bundle_config_hash once it matched the worker's (else None).
        self.verified_hash: str | None = None

    @property
    def operation(self) -> str:
        return self.item.operation

    # Its item's W3C trace context: a work is the parent of the spans its stages record (a tracing Carrier).
    @property
    def traceparent(self) -> str | None:
        return self.item.traceparent

    @property
    def tracestate(self) -> str | None:
        return self.item.tracestate


def lora_key_of(options: dict[str, Any] | None) -> str:
    """The batching key of a LoRA adapter: `options.lora_id`, "" for the base model."""
    if not options:
        return ""
    lora = options.get("lora_id")
    return lora if isinstance(lora, str) else ""


@attrs.frozen
class BatchLimits:
    """How big one batch of a model may be: padded cost (longest × count) and item count."""

    max_cost: int
    max_items: int


@attrs.frozen
class ReadyModel:
    """A model the worker reported ready: its descriptor and the batch limits derived from it."""

    model_id: str
    descriptor: ModelDescriptor
    limits: BatchLimits


T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

# One model's work, as stages hand it on: by model id before readiness, with the ready model after it.
AdmittedGroup = tuple[str, list[Work]]
ReadyGroup = tuple[ReadyModel, list[Work]]


class Outbox(Protocol[T_contra]):
    """Where a stage puts what it passes on; waits while the next stage is full (backpressure)."""

    async def put(self, item: T_contra) -> None: ...


class Channel(Generic[T]):
    """A bounded hand-off between two stages. What is still in it when the sidecar stops is drained and
    given back, so nothing waits in a channel for its ack-wait to run out."""

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[T] = asyncio.Queue(maxsize=maxsize)

    async def put(self, item: T) -> None:
        await self._queue.put(item)

    async def get(self) -> T:
        return await self._queue.get()

    def drain(self) -> list[T]:
        """Everything queued now, removed."""
        items = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items
