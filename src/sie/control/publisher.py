"""Config deltas on NATS core (seed 000 §3 "NATS publish behavior", §8.3): one ConfigNotification per affected
bundle to `sie.config.models.{bundle}` and the same object to `sie.config.models._all`.

The same message object goes to both subjects, so a broker transport encodes byte-identical JSON for each.
A failing bundle never stops the others; the caller gets the failed bundles back and reports a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs

from sie.catalog import Catalog, ModelConfig
from sie.catalog.names import CONFIG_ALL_SUBJECT, config_subject
from sie.control.errors import PublisherUnavailableError
from sie.transport.base import MessageBus, TransportError
from sie.wire.config import ConfigNotification

logger = logging.getLogger(__name__)


class DeltaPublisher:
    """Publishes config deltas on a MessageBus (NATS in production, loopback in `all` and tests)."""

    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus

    async def ensure_connected(self) -> None:
        """PublisherUnavailableError unless the bus can deliver now (a flush round-trip to the broker)."""
        try:
            await self._bus.flush()
        except TransportError as exc:
            raise PublisherUnavailableError(f"NATS is unavailable; config writes are refused: {exc}") from exc

    async def publish(self, notifications: Sequence[ConfigNotification]) -> list[str]:
        """Send each notification to its bundle subject and to `_all`; returns the bundles that failed."""
        failed = []
        for notification in notifications:
            try:
                await self._bus.publish(config_subject(notification.bundle_id), notification)
                await self._bus.publish(CONFIG_ALL_SUBJECT, notification)
            except TransportError as exc:
                logger.warning("config delta for bundle %s not published: %s", notification.bundle_id, exc)
                failed.append(notification.bundle_id)
        return failed


def build_notifications(
    catalog: Catalog, model: ModelConfig, delta: Delta, bundles: Sequence[str]
) -> list[ConfigNotification]:
    """One notification per affected bundle, hashes taken from the post-write catalog (seed 000 §8.3)."""
    pool_hashes = catalog.bundle_pool_config_hashes
    return [
        ConfigNotification(
            router_id=delta.router_id,
            bundle_id=bundle,
            epoch=delta.epoch,
            bundle_config_hash=catalog.bundle_config_hash(bundle),
            model_id=model.sie_id,
            model_config=delta.yaml_text,
            pool=model.effective_pool,
            bundle_pool_config_hashes={bundle: dict(pool_hashes.get(bundle, {}))},
            profiles_added=list(delta.profiles_added),
            affected_bundles=list(bundles),
            bundle_adapters=list(catalog.bundles[bundle].adapters),
        )
        for bundle in bundles
    ]


@attrs.frozen
class Delta:
    """What a committed write tells subscribers besides the catalog: who, which epoch, the YAML, new profiles."""

    router_id: str
    epoch: int
    yaml_text: str
    profiles_added: Sequence[str]
