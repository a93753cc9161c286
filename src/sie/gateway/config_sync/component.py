"""`ConfigSync`: the gateway's config-sync lifecycle in one async context manager: the delta subscription
and, when `SIE_CONFIG_SERVICE_URL` is set, the bootstrap retry task and the epoch poller (seed 000 §4).
Entering never waits for the config service.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self

import httpx

from sie.gateway.config_sync.bootstrap import Bootstrap
from sie.gateway.config_sync.client import ConfigServiceClient
from sie.gateway.config_sync.deltas import DeltaSubscriber
from sie.gateway.config_sync.poller import Poller
from sie.gateway.config_sync.state import ConfigState
from sie.gateway.config_sync.sync import ConfigSyncer
from sie.settings import ConfigSyncSettings
from sie.transport.base import MessageBus


class ConfigSync:
    """Starts the sync tasks on enter, cancels and awaits them (and closes the HTTP client) on exit."""

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
        syncer = ConfigSyncer(self.client, state) if self.client is not None else None
        self.bootstrap = Bootstrap(syncer)
        self.poller = Poller(syncer, settings.poll_interval_s) if syncer is not None else None
        self._tasks: list[asyncio.Task[object]] = []

    async def __aenter__(self) -> Self:
        await self.deltas.__aenter__()
        self._tasks.append(asyncio.create_task(self.bootstrap.run(), name="sie-config-bootstrap"))
        if self.poller is not None:
            self._tasks.append(asyncio.create_task(self.poller.run(), name="sie-config-poller"))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.deltas.__aexit__(*exc_info)
        if self.client is not None:
            await self.client.__aexit__(*exc_info)
