"""Export reconciliation on a worker (seed 001 "Live Config"): when `SIE_CONFIG_SERVICE_URL` is set, poll
`/v1/configs/epoch` and, when the epoch moved (forward, or backward after an epoch rewind) or the worker's
hash drifted from the acknowledged one, fetch `/v1/configs/export` and send this bundle's and pool's models
to the worker through ReplaceModelConfigs. The shared AppliedConfig advances only when the replacement was
applied in full and the worker's hash equals the control plane's pool-scoped hash; otherwise the snapshot
stays eligible for retry on the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import httpx

from sie.ipc.client import WorkerClient
from sie.settings import Settings
from sie.sidecar.config_apply import AppliedConfig
from sie.telemetry.logs import log_fields
from sie.wire.ipc_control import ModelConfigEntry, PingRequest, ReplaceModelConfigsRequest

logger = logging.getLogger(__name__)

CONFIGS_PREFIX = "/v1/configs"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_POOL = "default"


class ExportError(Exception):
    """The config service answered something unusable (this tick fails; the next one retries)."""


def model_pool(row: dict[str, Any]) -> str:
    pool = row.get("pool")
    return pool.strip().lower() if isinstance(pool, str) and pool.strip() else DEFAULT_POOL


def expected_hash(export: dict[str, Any], bundle: str, pool: str) -> str:
    """The control plane's hash for one worker: pool-scoped when the export carries it, else the bundle's."""
    pooled = export.get("bundle_pool_config_hashes") or {}
    scoped = pooled.get(bundle, {}).get(pool, "") if isinstance(pooled.get(bundle), dict) else ""
    return scoped or (export.get("bundle_config_hashes") or {}).get(bundle, "") or ""


def select_models(export: dict[str, Any], bundle: str, pool: str) -> list[ModelConfigEntry]:
    """The export's models routable in this bundle and assigned to this pool, as replacement entries."""
    entries = []
    for row in export["models"]:
        if bundle in (row.get("affected_bundles") or []) and model_pool(row) == pool:
            entries.append(ModelConfigEntry(model_id=row["model_id"], model_config=row["raw_yaml"]))
    return entries


class ExportReconciler:
    """Async context manager running the poll loop; a no-op without a service URL or an injected client."""

    def __init__(
        self,
        worker: WorkerClient,
        settings: Settings,
        state: AppliedConfig,
        *,
        http: httpx.AsyncClient | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.worker = worker
        self.state = state
        self.bundle = settings.lane.bundle
        self.pool = settings.lane.pool.lower() or DEFAULT_POOL
        self.interval_s = interval_s if interval_s is not None else settings.config_sync.poll_interval_s
        self._owns_http = http is None
        url = settings.config_sync.service_url
        if http is None and url:
            token = settings.auth.admin_token
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=DEFAULT_TIMEOUT_S)
        self.http = http
        self.replacements = 0  # ReplaceModelConfigs calls sent
        self.failures = 0  # ticks that failed or were not acknowledged
        self._fingerprint = ""  # the /epoch bundle_config_hashes_hash at the last acknowledged reconcile
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.http is not None

    async def __aenter__(self) -> ExportReconciler:
        if self.enabled:
            self._task = asyncio.create_task(self._run(), name="sie-export-reconciler")
        else:
            logger.info("no config service URL: export reconciliation is off")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._owns_http and self.http is not None:
            await self.http.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.reconcile_once()
            except Exception:  # noqa: BLE001 - logged; the next tick retries
                self.failures += 1
                logger.warning("export reconciliation failed; retrying in %.1fs", self.interval_s, exc_info=True)
            await asyncio.sleep(self.interval_s)

    async def _get_json(self, path: str) -> dict[str, Any]:
        if self.http is None:
            raise ExportError("no config service URL")
        response = await self.http.get(f"{CONFIGS_PREFIX}{path}")
        if response.status_code != httpx.codes.OK:
            raise ExportError(f"GET {CONFIGS_PREFIX}{path}: HTTP {response.status_code}")
        body = response.json()
        if not isinstance(body, dict):
            raise ExportError(f"GET {CONFIGS_PREFIX}{path}: expected a JSON object")
        return body

    async def _worker_hash(self) -> str:
        return (await self.worker.ping(PingRequest(timestamp_ms=time.time() * 1000))).bundle_config_hash

    async def reconcile_once(self) -> bool:
        """One tick; True when a replacement was sent and acknowledged."""
        remote = await self._get_json("/epoch")
        epoch = remote.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ExportError(f"GET /epoch: bad epoch {epoch!r}")
        fingerprint = remote.get("bundle_config_hashes_hash") or ""
        rewind = epoch < self.state.epoch
        worker_hash = await self._worker_hash()
        stale = (
            epoch != self.state.epoch
            or not self.state.bundle_config_hash
            or worker_hash != self.state.bundle_config_hash
            or (fingerprint and fingerprint != self._fingerprint)
        )
        if not stale:
            return False
        return await self._reconcile_export(rewind, worker_hash, fingerprint)

    async def _reconcile_export(self, rewind: bool, worker_hash: str, fingerprint: str) -> bool:
        export = await self._get_json("/export")
        epoch = export.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not isinstance(export.get("models"), list):
            raise ExportError("GET /export: expected an integer epoch and a 'models' list")
        if epoch < self.state.epoch and not rewind:
            logger.info("export epoch %d is older than the applied %d: skipped", epoch, self.state.epoch)
            return False
        expected = expected_hash(export, self.bundle, self.pool)
        if (epoch, expected) == (self.state.epoch, self.state.bundle_config_hash) and worker_hash == expected:
            self._fingerprint = fingerprint
            return False  # unchanged snapshot, already reconciled
        adapters = (export.get("bundle_adapters") or {}).get(self.bundle)
        request = ReplaceModelConfigsRequest(
            bundle_id=self.bundle, epoch=epoch, bundle_config_hash=expected,
            models=select_models(export, self.bundle, self.pool),
            bundle_adapters=list(adapters) if isinstance(adapters, list) else None,
        )  # fmt: skip
        self.replacements += 1
        response = await self.worker.replace_model_configs(request)
        if not response.applied or response.bundle_config_hash != expected:
            self.failures += 1
            logger.error(
                "export epoch %d for %s not acknowledged: worker hash %r, control plane %r "
                "(applied=%s, unsupported=%s)",
                epoch, self.bundle, response.bundle_config_hash, expected, response.applied,
                response.unsupported_models,
            )  # fmt: skip
            return False
        if rewind:
            logger.warning("config epoch rewound from %d to %d: reconciled from the export", self.state.epoch, epoch)
        self.state.epoch, self.state.bundle_config_hash = epoch, expected
        self._fingerprint = fingerprint
        logger.info("config export applied: %d models at epoch %d; bundle hash %s", len(request.models), epoch,
                    expected, extra=log_fields(event="config_applied", epoch=epoch, source="export",
                                               models=len(request.models), bundle_config_hash=expected))  # fmt: skip
        return True
