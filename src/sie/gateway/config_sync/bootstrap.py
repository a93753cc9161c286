"""The bootstrap retry loop (seed 000 §4.1): `bootstrap_once` until the first success, with exponential
backoff (1 s doubling to 60 s) and the degraded flag after 10 failures or 5 minutes of failing.
Never blocks start-up: the role runs it as a background task. Clock and sleep are injectable for tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import attrs

from sie.gateway.config_sync.client import ConfigServiceError
from sie.gateway.config_sync.state import ConfigState
from sie.gateway.config_sync.sync import BootstrapOutcome, ConfigSyncer, operation_outcome
from sie.telemetry.metrics import ConfigOperation, ConfigOutcome

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@attrs.frozen
class BackoffPolicy:
    """How the retry loop waits and when it calls itself degraded."""

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
    """Runs `bootstrap_once` until it succeeds once; the poller owns reconciliation afterwards."""

    def __init__(
        self,
        syncer: ConfigSyncer | None,
        policy: BackoffPolicy = BackoffPolicy(),
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.syncer = syncer
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        self.attempts = 0

    async def run(self) -> BootstrapOutcome | None:
        """The first successful outcome; None at once when no config service is configured."""
        if self.syncer is None:
            logger.info("SIE_CONFIG_SERVICE_URL is unset: serving the filesystem seed only")
            return None
        started = self.clock()
        failures = 0
        while True:
            self.attempts += 1
            try:
                outcome = await self.syncer.bootstrap_once()
            except ConfigServiceError as exc:
                failures += 1
                self._failed(self.syncer.state, exc, failures, self.clock() - started)
                await self.sleep(self.policy.delay(failures))
                continue
            self.syncer.state.telemetry.config_operation(ConfigOperation.BOOTSTRAP, ConfigOutcome.SUCCESS)
            self.syncer.state.degraded = False
            logger.info("config bootstrap applied %d models at epoch %d", outcome.applied, outcome.epoch)
            return outcome

    def _failed(self, state: ConfigState, exc: ConfigServiceError, failures: int, failing_for_s: float) -> None:
        state.telemetry.config_operation(ConfigOperation.BOOTSTRAP, operation_outcome(exc))
        degraded = self.policy.degraded(failures, failing_for_s)
        state.degraded = degraded
        level = logging.ERROR if degraded else logging.WARNING
        logger.log(level, "config bootstrap attempt %d failed (%s); retrying", failures, exc)
