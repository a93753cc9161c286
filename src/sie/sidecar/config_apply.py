"""Live config on a worker (seed 001 "Live Config"): bundle-scoped deltas from `sie.config.models.{bundle}`
are checked (producer, bundle, epoch, size) and forwarded to the worker as ApplyModelConfig; the applied
epoch and hash advance only when the worker's hash equals the control plane's.
"""

from __future__ import annotations

import logging
from typing import Final

import attrs

from sie.catalog.names import config_subject
from sie.catalog.trust import is_trusted_producer
from sie.ipc.client import WorkerClient
from sie.settings import Settings
from sie.telemetry.logs import log_fields
from sie.transport.base import MessageBus, Subscription
from sie.wire.config import ConfigNotification
from sie.wire.ipc_control import ApplyModelConfigRequest

logger = logging.getLogger(__name__)

MAX_MODEL_CONFIG_BYTES: Final = 1 << 20  # the config service refuses bigger bodies too


@attrs.define
class AppliedConfig:
    """The epoch and bundle hash this worker last acknowledged, shared by the delta path and the export
    reconciler (`sie.sidecar.config_export`); `""` = nothing acknowledged yet."""

    epoch: int = 0
    bundle_config_hash: str = ""


class ConfigApplier:
    """Subscribes to its bundle's deltas and applies the accepted ones through the worker."""

    def __init__(
        self, bus: MessageBus, worker: WorkerClient, settings: Settings, state: AppliedConfig | None = None
    ) -> None:
        self.bus = bus
        self.worker = worker
        self.bundle = settings.lane.bundle
        self.pool = settings.lane.pool
        self.trusted = settings.config_sync.trusted_producers
        self.trust_any = settings.config_sync.trust_any_producer
        self.state = state if state is not None else AppliedConfig()
        self.rejected = 0
        self._subscription: Subscription | None = None

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def bundle_config_hash(self) -> str:
        return self.state.bundle_config_hash

    async def __aenter__(self) -> ConfigApplier:
        self._subscription = await self.bus.subscribe(
            config_subject(self.bundle), self.on_delta, message_type=ConfigNotification
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()

    def refusal(self, note: ConfigNotification) -> str | None:
        """Why a delta is not applied, or None when it should be."""
        if not is_trusted_producer(note.router_id, self.trusted, self.trust_any):
            return f"untrusted producer {note.router_id!r}"
        if note.bundle_id != self.bundle:
            return f"delta for bundle {note.bundle_id!r}, this worker serves {self.bundle!r}"
        if note.epoch < self.epoch:
            return f"epoch {note.epoch} is older than the applied {self.epoch}"
        if len(note.model_config.encode()) > MAX_MODEL_CONFIG_BYTES:
            return f"model_config of {note.model_id} is over {MAX_MODEL_CONFIG_BYTES} bytes"
        return None

    def expected_hash(self, note: ConfigNotification) -> str:
        """The control plane's hash for this worker's scope: pool-scoped when the delta carries it."""
        return note.bundle_pool_config_hashes.get(self.bundle, {}).get(self.pool, "") or note.bundle_config_hash

    async def on_delta(self, subject: str, note: ConfigNotification) -> None:
        reason = self.refusal(note)
        if reason is not None:
            self.rejected += 1
            logger.warning("config delta dropped: %s", reason)
            return
        response = await self.worker.apply_model_config(
            ApplyModelConfigRequest(
                bundle_id=note.bundle_id, model_id=note.model_id, epoch=note.epoch,
                bundle_config_hash=note.bundle_config_hash, model_config=note.model_config,
                profiles_added=list(note.profiles_added), bundle_adapters=note.bundle_adapters,
            )
        )  # fmt: skip
        expected = self.expected_hash(note)
        if not response.applied or response.bundle_config_hash != expected:
            self.rejected += 1
            logger.error(
                "config epoch %d for %s not acknowledged: worker hash %r, control plane %r (applied=%s)",
                note.epoch, note.model_id, response.bundle_config_hash, expected, response.applied,
            )  # fmt: skip
            return
        self.state.epoch, self.state.bundle_config_hash = note.epoch, expected
        logger.info("config delta applied: model %s at epoch %d; bundle hash %s", note.model_id, note.epoch, expected,
                    extra=log_fields(event="config_applied", model=note.model_id, epoch=note.epoch, source="delta",
                                     bundle_config_hash=expected))  # fmt: skip
