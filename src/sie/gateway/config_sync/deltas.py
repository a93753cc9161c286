"""Live config deltas on `sie.config.models._all` (seed 000 §4.3): producer allowlist first, then an epoch-only
bump or an append-only merge; the epoch advances (set_max) only when the delta applied.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Sequence
from typing import Any, Self

from sie.catalog import CatalogError, ModelConfig, load_yaml, parse_model_config
from sie.catalog.names import CONFIG_ALL_SUBJECT
from sie.catalog.trust import is_trusted_producer
from sie.gateway.config_sync.state import ConfigState, DeltaRejectedError
from sie.telemetry.metrics import ConfigOperation, ConfigOutcome
from sie.transport.base import MessageBus, Subscription
from sie.wire.config import ConfigNotification

logger = logging.getLogger(__name__)

# What Kubernetes appends to a Deployment or StatefulSet name to name its pods.


class DeltaOutcome(enum.Enum):
    """What became of one notification."""

    UNTRUSTED = "untrusted"
    EPOCH_ONLY = "epoch_only"
    APPLIED = "applied"
    REJECTED = "rejected"

    @property
    def metric_outcome(self) -> ConfigOutcome:
        """Its sie.gateway.config.operations{operation="delta"} outcome."""
        return _METRIC_OUTCOMES[self]


_METRIC_OUTCOMES = {
    DeltaOutcome.UNTRUSTED: ConfigOutcome.UNTRUSTED,
    DeltaOutcome.EPOCH_ONLY: ConfigOutcome.SUCCESS,
    DeltaOutcome.APPLIED: ConfigOutcome.SUCCESS,
    DeltaOutcome.REJECTED: ConfigOutcome.REJECTED,
}


class DeltaSubscriber:
    """Subscribes inside `async with`; `handle` is the whole decision and is callable directly."""

    def __init__(
        self, bus: MessageBus, state: ConfigState, trusted_producers: Sequence[str], trust_any: bool = False
    ) -> None:
        self.bus = bus
        self.state = state
        self.trusted_producers = tuple(trusted_producers)
        self.trust_any = trust_any
        self._subscription: Subscription | None = None

    async def __aenter__(self) -> Self:
        if self.trust_any:
            logger.warning("SIE_NATS_CONFIG_TRUST_ANY_PRODUCER is on: config deltas from any producer are applied")
        self._subscription = await self.bus.subscribe(
            CONFIG_ALL_SUBJECT, self._on_message, message_type=ConfigNotification
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            await subscription.unsubscribe()

    async def _on_message(self, subject: str, message: Any) -> None:
        if isinstance(message, ConfigNotification):
            await self.handle(message)
        else:
            logger.debug("ignoring a non-config message on %s: %r", subject, type(message))

    async def handle(self, note: ConfigNotification) -> DeltaOutcome:
        """Decide one notification and record it as one `delta` operation."""
        outcome = await self._decide(note)
        self.state.telemetry.config_operation(ConfigOperation.DELTA, outcome.metric_outcome)
        return outcome

    async def _decide(self, note: ConfigNotification) -> DeltaOutcome:
        if not is_trusted_producer(note.router_id, self.trusted_producers, self.trust_any):
            logger.warning("dropping a config delta from untrusted producer %r", note.router_id)
            return DeltaOutcome.UNTRUSTED
        if not note.model_config.strip():
            self.state.epoch.set_max(note.epoch)
            return DeltaOutcome.EPOCH_ONLY
        try:
            model = await asyncio.to_thread(_parse, note)
            async with self.state.write_lock:
                self.state.add_model_config(model)
        except (CatalogError, DeltaRejectedError) as exc:
            logger.warning("config delta for %r (epoch %d) not applied: %s", note.model_id, note.epoch, exc)
            return DeltaOutcome.REJECTED
        self.state.epoch.set_max(note.epoch)
        return DeltaOutcome.APPLIED


def _parse(note: ConfigNotification) -> ModelConfig:
    source = f"delta:{note.model_id}"
    return parse_model_config(load_yaml(note.model_config, source), source)
