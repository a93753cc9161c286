"""The epoch poller (seed 000 §4.2): every poll interval, after skipping the first tick, compare the config
service's `/epoch` with local state and realign. Poll failures are logged and swallowed.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from sie.gateway.config_sync.bootstrap import Sleep
from sie.gateway.config_sync.client import ConfigServiceError, RemoteEpoch
from sie.gateway.config_sync.state import ConfigState
from sie.gateway.config_sync.sync import ConfigSyncer, operation_outcome
from sie.telemetry.metrics import ConfigOperation, ConfigOutcome

logger = logging.getLogger(__name__)


class PollOutcome(enum.Enum):
    """What one tick did."""

    IN_SYNC = "in_sync"
    RESYNCED = "resynced"
    RECOVERED = "recovered"
    FAILED = "failed"


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
    """One tick per `interval_s`; the first is skipped so the bootstrap attempt runs uncontended."""

    def __init__(self, syncer: ConfigSyncer, interval_s: float, sleep: Sleep = asyncio.sleep) -> None:
        self.syncer = syncer
        self.interval_s = interval_s
        self.sleep = sleep

    async def run(self) -> None:
        while True:
            await self.sleep(self.interval_s)
            await self.tick()

    async def tick(self) -> PollOutcome:
        """One comparison and realignment, recorded as one `poll` operation."""
        telemetry = self.syncer.state.telemetry
        try:
            outcome = await self._tick()
        except ConfigServiceError as exc:
            telemetry.config_operation(ConfigOperation.POLL, operation_outcome(exc))
            logger.warning("config poll failed (will retry next tick): %s", exc)
            return PollOutcome.FAILED
        telemetry.config_operation(ConfigOperation.POLL, ConfigOutcome.SUCCESS)
        return outcome

    async def _tick(self) -> PollOutcome:
        state = self.syncer.state
        remote = await self.syncer.client.epoch()
        if remote.epoch < state.epoch.get():
            await self.syncer.recover(remote)
            return PollOutcome.RECOVERED
        if not drifted(remote, state):
            return PollOutcome.IN_SYNC
        await self.syncer.bootstrap_once()
        return PollOutcome.RESYNCED
