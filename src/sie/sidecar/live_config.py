"""Live config on a worker (seed 001 "Live Config"): `LiveConfig` is the one owner of the epoch and bundle hash
the worker acknowledged, and its two paths are the only writers. Deltas from `sie.config.models.{bundle}` are
checked (producer, bundle, epoch, size) and forwarded as ApplyModelConfig. When `SIE_CONFIG_SERVICE_URL` is set,
`/v1/configs/epoch` is polled and, when the epoch moved (forward, or backward after an epoch rewind) or the
worker's hash drifted from the acknowledged one, `/v1/configs/export` is fetched and this bundle's and pool's
models replace the worker's through ReplaceModelConfigs. Either path advances the acknowledged state only when
the worker applied the change and its hash equals the control plane's (pool-scoped when given); a replacement
not acknowledged stays eligible for retry on the next tick. Others (the heartbeat) only read it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import attrs
import httpx

from sie.catalog.names import config_subject
from sie.catalog.trust import is_trusted_producer
from sie.ipc.client import WorkerClient
from sie.runtime.periodic import FirstRun, Outage, PeriodicTask
from sie.settings import Settings
from sie.telemetry.logs import log_fields
from sie.transport.base import MessageBus, Subscription
from sie.wire.config import ConfigNotification
from sie.wire.ipc_control import ApplyModelConfigRequest, ModelConfigEntry, PingRequest, ReplaceModelConfigsRequest

logger = logging.getLogger(__name__)

MAX_MODEL_CONFIG_BYTES: Final = 1 << 20  # the config service refuses bigger bodies too
CONFIGS_PREFIX = "/v1/configs"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_POOL = "default"


@attrs.frozen
class AppliedConfig:
    """The epoch and bundle hash this worker last acknowledged; `""` = nothing acknowledged yet."""

    epoch: int = 0
    bundle_config_hash: str = ""


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


class LiveConfig:
    """The applied config of one worker and the two paths that change it.

    `async with` subscribes to the bundle's deltas, then starts the export poll loop when a config service URL
    is set (or an `http` client is injected); on exit it stops the loop and unsubscribes.
    """

    def __init__(
        self,
        bus: MessageBus,
        worker: WorkerClient,
        settings: Settings,
        *,
        http: httpx.AsyncClient | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.bus = bus
        self.worker = worker
        self.bundle = settings.lane.bundle
        self.pool = settings.lane.pool
        self.export_pool = settings.lane.pool.lower() or DEFAULT_POOL  # as the export's rows name pools (model_pool)
        self.trusted = settings.config_sync.trusted_producers
        self.trust_any = settings.config_sync.trust_any_producer
        self.interval_s = interval_s if interval_s is not None else settings.config_sync.poll_interval_s
        self._owns_http = http is None
        url = settings.config_sync.service_url
        if http is None and url:
            token = settings.auth.admin_token
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=DEFAULT_TIMEOUT_S)
        self.http = http
        self.rejected = 0  # deltas dropped or not acknowledged
        self.replacements = 0  # ReplaceModelConfigs calls sent
        self._applied = AppliedConfig()
        self._fingerprint = ""  # the /epoch bundle_config_hashes_hash at the last acknowledged reconcile
        self._subscription: Subscription | None = None
        self._reconciling: PeriodicTask | None = None
        if http is not None:  # a failed tick keeps the applied state; the next one retries
            outage = Outage("export reconciliation", logger, (ExportError, httpx.HTTPError))
            self._reconciling = PeriodicTask(self.reconcile_once, lambda: self.interval_s, outage,
                                             first_run=FirstRun.AT_START)  # fmt: skip

    @property
    def applied(self) -> AppliedConfig:
        return self._applied

    @property
    def epoch(self) -> int:
        return self._applied.epoch

    @property
    def bundle_config_hash(self) -> str:
        return self._applied.bundle_config_hash

    @property
    def reconciles_export(self) -> bool:
        """Whether the export path runs (a config service URL, or an injected client)."""
        return self.http is not None

    async def __aenter__(self) -> LiveConfig:
        self._subscription = await self.bus.subscribe(
            config_subject(self.bundle), self.on_delta, message_type=ConfigNotification
        )
        if self._reconciling is not None:
            await self._reconciling.__aenter__()
        else:
            logger.info("no config service URL: export reconciliation is off")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            if self._reconciling is not None:
                await self._reconciling.__aexit__(*exc_info)
            if self._owns_http and self.http is not None:
                await self.http.aclose()
        finally:
            if self._subscription is not None:
                await self._subscription.unsubscribe()

    def _acknowledge(self, epoch: int, bundle_config_hash: str) -> None:
        """The only write of the applied state: the worker acknowledged `epoch` with the expected hash."""
        self._applied = AppliedConfig(epoch, bundle_config_hash)

    # --- the delta path -----------------------------------------------------------------------------

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
        self._acknowledge(note.epoch, expected)
        logger.info("config delta applied: model %s at epoch %d; bundle hash %s", note.model_id, note.epoch, expected,
                    extra=log_fields(event="config_applied", model=note.model_id, epoch=note.epoch, source="delta",
                                     bundle_config_hash=expected))  # fmt: skip

    # --- the export path ----------------------------------------------------------------------------

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
        rewind = epoch < self.epoch
        worker_hash = await self._worker_hash()
        stale = (
            epoch != self.epoch
            or not self.bundle_config_hash
            or worker_hash != self.bundle_config_hash
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
        if epoch < self.epoch and not rewind:
            logger.info("export epoch %d is older than the applied %d: skipped", epoch, self.epoch)
            return False
        expected = expected_hash(export, self.bundle, self.export_pool)
        if (epoch, expected) == (self.epoch, self.bundle_config_hash) and worker_hash == expected:
            self._fingerprint = fingerprint
            return False  # unchanged snapshot, already reconciled
        adapters = (export.get("bundle_adapters") or {}).get(self.bundle)
        request = ReplaceModelConfigsRequest(
            bundle_id=self.bundle, epoch=epoch, bundle_config_hash=expected,
            models=select_models(export, self.bundle, self.export_pool),
            bundle_adapters=list(adapters) if isinstance(adapters, list) else None,
        )  # fmt: skip
        self.replacements += 1
        response = await self.worker.replace_model_configs(request)
        if not response.applied or response.bundle_config_hash != expected:
            logger.error(
                "export epoch %d for %s not acknowledged: worker hash %r, control plane %r "
                "(applied=%s, unsupported=%s)",
                epoch, self.bundle, response.bundle_config_hash, expected, response.applied,
                response.unsupported_models,
            )  # fmt: skip
            return False
        if rewind:
            logger.warning("config epoch rewound from %d to %d: reconciled from the export", self.epoch, epoch)
        self._acknowledge(epoch, expected)
        self._fingerprint = fingerprint
        logger.info("config export applied: %d models at epoch %d; bundle hash %s", len(request.models), epoch,
                    expected, extra=log_fields(event="config_applied", epoch=epoch, source="export",
                                               models=len(request.models), bundle_config_hash=expected))  # fmt: skip
        return True
