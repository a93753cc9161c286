"""The write path (seed 000 §3), one named step per stage, all under ONE asyncio.Lock: validate → plan
(created vs skipped, 409 conflicts) → check the publisher → store the next epoch → persist → swap the
registry → serve the new epoch → publish. Persisting comes before the registry swap, so a failed store write
changes nothing visible; once the commit phase starts it runs to the end even if the caller is cancelled
(`run_to_completion`).

The epoch moves only when a store is configured (seed 000 §3.3.5), once per creating write. Its stored copy
is written ahead of the change it numbers: a crash (or a failed write) in between leaves a newer stored epoch
over the old models, which only makes gateways re-export, never an old epoch over new models, which would let
them believe they are current. Readers see the new epoch only after the registry swap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import attrs

from sie.catalog import InvalidModelIdError, ModelConfig, dump_yaml, load_yaml
from sie.control import merge, views
from sie.control.errors import ConfigStoreRequiredError, ContentConflictError
from sie.control.publisher import Delta, DeltaPublisher, build_notifications
from sie.control.registry import SOURCE_API, ModelRegistry, RegistryState
from sie.stores.config_store import ConfigStore, ModelIdNotStorableError, model_file_name
from sie.telemetry.logs import log_fields

logger = logging.getLogger(__name__)

STANDALONE_ROUTER_ID: Final = "standalone"
EPOCH_EXPORT: Final = "epoch_export"
T = TypeVar("T")
OnCommit = Callable[[], None] | None


async def run_to_completion(step: Awaitable[T]) -> T:
    """Await `step` to its end; a cancellation meanwhile is deferred and re-raised afterwards."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True  # keep waiting: the store, registry and epoch must not diverge
    if cancelled:
        raise asyncio.CancelledError
    return result


@attrs.frozen
class AddOutcome:
    """What POST /models reports; `created` tells 201 from 200."""

    model_id: str
    created_profiles: list[str]
    existing_profiles_skipped: list[str]
    warnings: list[dict[str, Any]]
    routable_bundles_by_profile: dict[str, list[str]]
    router_id: str

    @property
    def created(self) -> bool:
        return bool(self.created_profiles)


@attrs.frozen
class ReplaceOutcome:
    """What PUT /models/{id} reports."""

    model_id: str
    replaced: bool
    unchanged: bool
    affected_bundles: list[str]
    warnings: list[dict[str, Any]]
    router_id: str


@attrs.frozen
class DeleteOutcome:
    """What DELETE /models/{id} reports; deletes travel by epoch + export, never as a delta."""

    model_id: str
    deleted: bool
    unchanged: bool
    fallback: str | None
    affected_bundles: list[str]
    epoch: int
    distribution: str = EPOCH_EXPORT


def _publish_warnings(failed: Sequence[str]) -> list[dict[str, Any]]:
    if not failed:
        return []
    message = f"Config written, but the NATS delta was not published for bundles: {', '.join(failed)}"
    return [{"code": "nats_publish_partial", "message": message, "failed_bundles": list(failed)}]


def _union(*groups: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(name for group in groups for name in group))


class ConfigWriter:
    """The single writer of model configuration; owns the write lock and the epoch."""

    def __init__(
        self,
        registry: ModelRegistry,
        store: ConfigStore | None = None,
        publisher: DeltaPublisher | None = None,
        *,
        router_id: str = STANDALONE_ROUTER_ID,
        epoch: int = 0,
    ) -> None:
        self._registry = registry
        self._store = store
        self._publisher = publisher
        self.router_id = router_id if publisher is not None else STANDALONE_ROUTER_ID
        self._epoch = epoch
        # Created on construction, bound to the loop of its first use (Python ≥ 3.10).
        self._lock = asyncio.Lock()

    @property
    def epoch(self) -> int:
        return self._epoch

    # POST /models

    async def add_model(self, document: dict[str, Any], *, on_commit: OnCommit = None) -> AddOutcome:
        """Append the document's profiles to the model (seed 000 §3.3); a full replay changes nothing."""
        async with self._lock:
            state = self._registry.state
            plan, model, routable = self._plan_add(state, document)
            outcome = AddOutcome(model.sie_id, plan.created, plan.skipped, [], routable, self.router_id)
            if not plan.created:
                await self._check_disk_drift(document)
                return outcome
            await self._check_publisher()
            _enter_commit(on_commit)
            yaml_text = await asyncio.to_thread(dump_yaml, plan.merged)
            bundles = views.model_bundle_names(state.catalog, model)
            warnings = await run_to_completion(self._commit(state, model, yaml_text, plan.created, bundles))
            return attrs.evolve(outcome, warnings=warnings)

    async def _check_disk_drift(self, document: dict[str, Any]) -> None:
        """A replay that creates nothing is also checked against the stored file (seed 000 §3.3.2): a store
        that drifted from the in-memory registry answers 409 content_conflict instead of a silent skip."""
        if self._store is None:
            return
        stored = (await asyncio.to_thread(self._store.list_models)).get(document["sie_id"])
        if stored is None:
            return
        existing = merge.parse_checked(await asyncio.to_thread(load_yaml, stored))
        merge.plan_append(existing, document)  # raises ContentConflictError when the disk disagrees

    def _plan_add(
        self, state: RegistryState, document: dict[str, Any]
    ) -> tuple[merge.AppendPlan, ModelConfig, dict[str, list[str]]]:
        merge.require_fields(document)
        self._check_storable(document["sie_id"])
        plan = merge.plan_append(state.find_model(document["sie_id"]), document)
        model = merge.parse_checked(plan.merged)
        routable = merge.check_routable(state.catalog, model, sorted(document["profiles"]))
        return plan, model, routable

    # PUT /models/{id}

    async def replace_model(self, document: dict[str, Any], *, on_commit: OnCommit = None) -> ReplaceOutcome:
        """Replace the model wholesale; an identical document is `unchanged` and bumps nothing."""
        async with self._lock:
            state = self._registry.state
            model, existing = self._plan_replace(state, document)
            if existing is not None and dict(existing.raw) == document:
                return ReplaceOutcome(model.sie_id, False, True, [], [], self.router_id)
            await self._check_publisher()
            _enter_commit(on_commit)
            yaml_text = await asyncio.to_thread(dump_yaml, document)
            old = views.model_bundle_names(state.catalog, existing) if existing is not None else []
            bundles = _union(old, views.model_bundle_names(state.catalog, model))
            added = sorted(
                name for name, profile in model.profiles.items()
                if existing is None or existing.profiles.get(name) != profile
            )  # fmt: skip
            warnings = await run_to_completion(self._commit(state, model, yaml_text, added, bundles))
            return ReplaceOutcome(model.sie_id, True, False, bundles, warnings, self.router_id)

    def _plan_replace(self, state: RegistryState, document: dict[str, Any]) -> tuple[ModelConfig, ModelConfig | None]:
        merge.require_fields(document)
        self._check_storable(document["sie_id"])
        model = merge.parse_checked(document)
        merge.check_routable(state.catalog, model, sorted(model.profiles))
        existing = state.find_model(model.sie_id)
        if existing is not None and existing.sie_id != model.sie_id:
            raise ContentConflictError(existing.sie_id, fields=["sie_id"])
        return model, existing

    # DELETE /models/{id}

    async def delete_model(self, model_id: str, *, on_commit: OnCommit = None) -> DeleteOutcome:
        """Remove an API-written model (its filesystem baseline, if any, comes back); needs a store."""
        if self._store is None:
            raise ConfigStoreRequiredError(
                "Deleting a model requires a config store (set SIE_CONFIG_STORE_DIR); without one the "
                "deletion would not survive a restart."
            )
        async with self._lock:
            state = self._registry.state
            model = state.find_model(model_id)
            if model is None or state.source(model.sie_id) != SOURCE_API:
                return DeleteOutcome(model_id, False, True, None, [], self._epoch)
            _enter_commit(on_commit)
            return await run_to_completion(self._commit_delete(state, model))

    async def _commit_delete(self, state: RegistryState, model: ModelConfig) -> DeleteOutcome:
        epoch = await self._store_next_epoch()
        await self._persist_delete(model.sie_id)
        new_state = state.without_api_model(model.sie_id)
        self._registry.swap(new_state)
        self._epoch = epoch
        logger.info("config delete applied: model %s at epoch %d", model.sie_id, epoch,
                    extra=log_fields(event="config_deleted", model=model.sie_id, epoch=epoch))  # fmt: skip
        fallback = new_state.catalog.models.get(model.sie_id)
        bundles = _union(
            views.model_bundle_names(state.catalog, model),
            views.model_bundle_names(new_state.catalog, fallback) if fallback is not None else [],
        )
        fallback_source = "filesystem" if fallback is not None else None
        return DeleteOutcome(model.sie_id, True, False, fallback_source, bundles, self._epoch)

    # GET /export

    async def export(self) -> dict[str, Any]:
        """The snapshot, taken under the write lock so (epoch, models) is a state that existed between writes."""
        async with self._lock:
            return views.export_snapshot(self._registry.state, self._epoch, datetime.now(UTC))

    # the steps

    def _check_storable(self, model_id: str) -> None:
        if self._store is None:
            return
        try:
            model_file_name(model_id)
        except ModelIdNotStorableError as exc:
            raise InvalidModelIdError(f"Model ID cannot be stored: {exc}.", model_id=model_id, field="sie_id") from exc

    async def _check_publisher(self) -> None:
        if self._publisher is not None:
            await self._publisher.ensure_connected()

    async def _commit(
        self, state: RegistryState, model: ModelConfig, yaml_text: str, added: Sequence[str], bundles: Sequence[str]
    ) -> list[dict[str, Any]]:
        epoch = await self._store_next_epoch()
        await self._persist(model.sie_id, yaml_text)
        new_state = state.with_api_model(model, yaml_text)
        self._registry.swap(new_state)
        self._epoch = epoch
        _log_write(model.sie_id, epoch, added, bundles)
        return await self._publish(new_state, model, Delta(self.router_id, self._epoch, yaml_text, added), bundles)

    async def _persist(self, model_id: str, yaml_text: str) -> None:
        if self._store is not None:
            await asyncio.to_thread(self._store.write_model, model_id, yaml_text)

    async def _persist_delete(self, model_id: str) -> None:
        if self._store is not None:
            await asyncio.to_thread(self._store.delete_model, model_id)

    async def _store_next_epoch(self) -> int:
        """Write epoch + 1 to the store before the change it numbers (see the module); the epoch to serve once
        the change is in the registry. Without a store the epoch stays."""
        if self._store is None:
            return self._epoch
        epoch = self._epoch + 1
        await asyncio.to_thread(self._store.write_epoch, epoch)
        return epoch

    async def _publish(
        self, state: RegistryState, model: ModelConfig, delta: Delta, bundles: Sequence[str]
    ) -> list[dict[str, Any]]:
        if self._publisher is None or not bundles:
            return []
        notifications = build_notifications(state.catalog, model, delta, bundles)
        try:
            return _publish_warnings(await self._publisher.publish(notifications))
        except Exception as exc:  # noqa: BLE001 - the write is durable; the caller must still learn it succeeded
            logger.exception("publishing config deltas for %s failed", model.sie_id)
            return [
                {
                    "code": "nats_publish_failed",
                    "message": f"NATS publish failed: {exc}",
                    "failed_bundles": list(bundles),
                }
            ]


def _log_write(model_id: str, epoch: int, profiles: Sequence[str], bundles: Sequence[str]) -> None:
    logger.info("config write applied: model %s at epoch %d (profiles %s; bundles %s)", model_id, epoch,
                ",".join(profiles) or "none changed", ",".join(bundles) or "none",
                extra=log_fields(event="config_written", model=model_id, epoch=epoch, profiles=list(profiles),
                                 bundles=list(bundles)))  # fmt: skip


def _enter_commit(on_commit: OnCommit) -> None:
    """Tell an idempotency owner that irreversible side effects start now."""
    if on_commit is not None:
        on_commit()
