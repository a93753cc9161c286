"""How the gateway follows the config service (seed 000 §4): `StateRealigner` fetches and swaps the registry
(bootstrap_once, rewind recovery); `Bootstrap` retries it with backoff until the first success; `Poller` compares
epochs and fingerprints and realigns; `DeltaSubscriber` merges live deltas from the bus; `ConfigSync` is the
lifecycle component that runs them all. Reads the config service only through `remote`; no web framework here.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

import attrs
import httpx

from sie.catalog import CatalogError, ModelConfig, load_yaml, parse_model_config
from sie.catalog.names import CONFIG_ALL_SUBJECT
from sie.catalog.trust import is_trusted_producer
from sie.gateway.config_sync.remote import (
    ConfigServiceClient,
    ConfigServiceError,
    ExportModels,
    RemoteEpoch,
    parse_export,
)
from sie.gateway.config_sync.state import ConfigState, DeltaRejectedError
from sie.runtime.periodic import Outage, PeriodicTask
from sie.settings import ConfigSyncSettings
from sie.telemetry.logs import log_fields
from sie.telemetry.metrics import ConfigOperation, ConfigOutcome
from sie.transport.base import MessageBus, Subscription
from sie.wire.config import ConfigNotification

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class PartialApplyError(ConfigServiceError):
    """Some export rows failed: nothing was applied and neither the epoch nor the fingerprints moved."""

    def __init__(self, failed: int, total: int) -> None:
        self.failed = failed
        self.total = total
        super().__init__(f"{failed} of {total} exported models failed to apply")


@attrs.frozen
class BootstrapOutcome:
    """What one successful `bootstrap_once` applied."""

    epoch: int
    bundles_hash: str
    bundle_config_hashes_hash: str
    applied: int
    total: int


def operation_outcome(exc: ConfigServiceError) -> ConfigOutcome:
    """The sie.gateway.config.operations outcome of a failed fetch: `partial` for a partial apply."""
    return ConfigOutcome.PARTIAL if isinstance(exc, PartialApplyError) else ConfigOutcome.FAILURE


class StateRealigner:
    """Realigns the gateway's ConfigState with the config service: `bootstrap_once` (§4.1) and rewind recovery (§4.2).

    Both fetch, then swap the registry under its write lock; neither retries (Bootstrap and Poller do).
    """

    def __init__(self, client: ConfigServiceClient, state: ConfigState) -> None:
        self.client = client
        self.state = state

    async def bootstrap_once(self) -> BootstrapOutcome:
        """`/epoch` first (its hashes must not be newer than what we install), then bundles, then export."""
        remote = await self.client.epoch()
        bundles = await self.client.bundles()
        async with self.state.write_lock:
            self.state.install_bundles(bundles)
        export = await self._apply_export()
        self.state.epoch.set_max(remote.epoch)
        self.state.store_hashes(remote.bundles_hash, remote.bundle_config_hashes_hash)
        return BootstrapOutcome(
            remote.epoch, remote.bundles_hash, remote.bundle_config_hashes_hash, len(export.models), export.total
        )

    async def recover(self, remote: RemoteEpoch) -> None:
        """Local epoch ran ahead of authority: replace the model set from the export, then force the epoch."""
        logger.error(
            "local config epoch %d is ahead of the config service's %d; re-exporting",
            self.state.epoch.get(),
            remote.epoch,
        )
        await self._apply_export()
        self.state.epoch.force_set(remote.epoch)

    async def _apply_export(self) -> ExportModels:
        telemetry = self.state.telemetry
        try:
            body = await self.client.export()
            async with self.state.write_lock:
                export = await asyncio.to_thread(parse_export, body, self.state.catalog)
                if export.failed:
                    raise PartialApplyError(export.failed, export.total)
                self.state.replace_models(export.models)
        except ConfigServiceError as exc:
            telemetry.config_operation(ConfigOperation.EXPORT, operation_outcome(exc))
            raise
        telemetry.config_operation(ConfigOperation.EXPORT, ConfigOutcome.SUCCESS)
        return export


@attrs.frozen
class BackoffPolicy:
    """How the retry loop waits (1 s doubling to 60 s) and when it calls itself degraded (10 failures or 5 minutes)."""

    initial_s: float = 1.0
    cap_s: float = 60.0
    degraded_after_failures: int = 10
    degraded_after_s: float = 300.0

    def delay(self, failures: int) -> float:
        """The sleep after the `failures`-th consecutive failure (1-based)."""
        return min(self.cap_s, self.initial_s * 2 ** min(failures - 1, 32))

    def degraded(self, failures: int, failing_for_s: float) -> bool:
        return failures >= self.degraded_after_failures or failing_for_s >= self.degraded_after_s


class Bootstrap:
    """The bootstrap retry loop (§4.1): `bootstrap_once` until it succeeds once; the poller owns reconciliation after.

    Never blocks start-up (ConfigSync runs it as a background task); clock and sleep are injectable for tests.
    """

    def __init__(
        self,
        realigner: StateRealigner | None,
        policy: BackoffPolicy = BackoffPolicy(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.realigner = realigner
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        self.attempts = 0

    async def run(self) -> BootstrapOutcome | None:
        """The first successful outcome; None at once when no config service is configured."""
        if self.realigner is None:
            logger.info("SIE_CONFIG_SERVICE_URL is unset: serving the filesystem seed only")
            return None
        started = self.clock()
        failures = 0
        while True:
            self.attempts += 1
            try:
                outcome = await self.realigner.bootstrap_once()
            except ConfigServiceError as exc:
                failures += 1
                self._failed(self.realigner.state, exc, failures, self.clock() - started)
                await self.sleep(self.policy.delay(failures))
                continue
            self.realigner.state.telemetry.config_operation(ConfigOperation.BOOTSTRAP, ConfigOutcome.SUCCESS)
            self.realigner.state.degraded = False
            logger.info("config bootstrap applied %d models at epoch %d", outcome.applied, outcome.epoch,
                        extra=log_fields(event="config_applied", epoch=outcome.epoch, source="bootstrap",
                                         models=outcome.applied))  # fmt: skip
            return outcome

    def _failed(self, state: ConfigState, exc: ConfigServiceError, failures: int, failing_for_s: float) -> None:
        state.telemetry.config_operation(ConfigOperation.BOOTSTRAP, operation_outcome(exc))
        degraded = self.policy.degraded(failures, failing_for_s)
        state.degraded = degraded
        level = logging.ERROR if degraded else logging.WARNING
        logger.log(level, "config bootstrap attempt %d failed (%s); retrying", failures, exc)


class PollOutcome(enum.Enum):
    """What one tick did (a failed tick raises)."""

    IN_SYNC = "in_sync"
    RESYNCED = "resynced"
    RECOVERED = "recovered"


def drifted(remote: RemoteEpoch, state: ConfigState) -> bool:
    """Remote epoch ahead, or a fingerprint changed; a remote `""` fingerprint is skipped, never compared."""
    if remote.epoch > state.epoch.get():
        return True
    if remote.bundles_hash and remote.bundles_hash != state.bundles_hash:
        return True
    return bool(remote.bundle_config_hashes_hash) and (
        remote.bundle_config_hashes_hash != state.bundle_config_hashes_hash
    )


class Poller:
    """The epoch poller (§4.2): each tick compares `/epoch` with local state and realigns.

    `async with` ticks every `interval_s`, the first tick one interval after entry so the bootstrap attempt runs
    uncontended; a failed tick is recorded, said once per outage, and the next tick retries.
    """

    def __init__(self, realigner: StateRealigner, interval_s: float) -> None:
        self.realigner = realigner
        self.interval_s = interval_s
        self._ticking = PeriodicTask(self.tick, interval_s, Outage("config poll", logger, (ConfigServiceError,)))

    async def __aenter__(self) -> Self:
        await self._ticking.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._ticking.__aexit__(*exc_info)

    async def tick(self) -> PollOutcome:
        """One comparison and realignment, recorded as one `poll` operation; a failure is recorded, then raised."""
        telemetry = self.realigner.state.telemetry
        try:
            outcome = await self._tick()
        except ConfigServiceError as exc:
            telemetry.config_operation(ConfigOperation.POLL, operation_outcome(exc))
            raise
        telemetry.config_operation(ConfigOperation.POLL, ConfigOutcome.SUCCESS)
        return outcome

    async def _tick(self) -> PollOutcome:
        state = self.realigner.state
        remote = await self.realigner.client.epoch()
        if remote.epoch < state.epoch.get():
            await self.realigner.recover(remote)
            return PollOutcome.RECOVERED
        if not drifted(remote, state):
            return PollOutcome.IN_SYNC
        outcome = await self.realigner.bootstrap_once()
        logger.info("config resynced from the config service's export: %d models at epoch %d", outcome.applied,
                    outcome.epoch, extra=log_fields(event="config_applied", epoch=outcome.epoch, source="poll",
                                                    models=outcome.applied))  # fmt: skip
        return PollOutcome.RESYNCED


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
    """Live deltas on `sie.config.models._all` (§4.3): producer allowlist first, then an epoch-only bump or an
    append-only merge; the epoch advances (set_max) only when the delta applied.

    Subscribes inside `async with`; `handle` is the whole decision and is callable directly.
    """

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
        logger.info("config delta applied: model %s at epoch %d (from %s)", note.model_id, note.epoch, note.router_id,
                    extra=log_fields(event="config_applied", model=note.model_id, epoch=note.epoch,
                                     source="delta"))  # fmt: skip
        return DeltaOutcome.APPLIED


def _parse(note: ConfigNotification) -> ModelConfig:
    source = f"delta:{note.model_id}"
    return parse_model_config(load_yaml(note.model_config, source), source)


class ConfigSync:
    """The gateway's config-sync lifecycle: the delta subscription and, when `SIE_CONFIG_SERVICE_URL` is set, the
    bootstrap retry task and the epoch poller.

    Starts the sync tasks on enter without waiting for the config service; cancels and awaits them (and closes the
    HTTP client) on exit.
    """

    def __init__(
        self,
        state: ConfigState,
        bus: MessageBus,
        settings: ConfigSyncSettings,
        admin_token: str | None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.state = state
        self.deltas = DeltaSubscriber(bus, state, settings.trusted_producers, settings.trust_any_producer)
        self.client = (
            ConfigServiceClient.create(settings.service_url, admin_token, transport=transport)
            if settings.service_url
            else None
        )
        realigner = StateRealigner(self.client, state) if self.client is not None else None
        self.bootstrap = Bootstrap(realigner)
        self.poller = Poller(realigner, settings.poll_interval_s) if realigner is not None else None
        self._bootstrapping: asyncio.Task[BootstrapOutcome | None] | None = None

    async def __aenter__(self) -> Self:
        await self.deltas.__aenter__()
        self._bootstrapping = asyncio.create_task(self.bootstrap.run(), name="sie-config-bootstrap")
        if self.poller is not None:
            await self.poller.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.poller is not None:
            await self.poller.__aexit__(*exc_info)
        bootstrapping, self._bootstrapping = self._bootstrapping, None
        if bootstrapping is not None:
            bootstrapping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bootstrapping
        await self.deltas.__aexit__(*exc_info)
        if self.client is not None:
            await self.client.__aexit__(*exc_info)
