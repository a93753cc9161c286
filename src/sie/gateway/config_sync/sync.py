"""`bootstrap_once` and rewind recovery (seed 000 §4.1, §4.2): the two ways the gateway realigns with the
config service. Both fetch, then swap the registry under its write lock; neither retries (Bootstrap and Poller do).
"""

from __future__ import annotations

import asyncio
import logging

import attrs

from sie.gateway.config_sync.client import ConfigServiceClient, ConfigServiceError, RemoteEpoch
from sie.gateway.config_sync.export import ExportModels, parse_export
from sie.gateway.config_sync.state import ConfigState
from sie.telemetry.metrics import ConfigOperation, ConfigOutcome

logger = logging.getLogger(__name__)


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


class ConfigSyncer:
    """Fetches from the config service and writes the gateway's ConfigState."""

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
