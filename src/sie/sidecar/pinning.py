"""Pinned models (seed 000 §16.3): the models a pool names in `pinned_models` are loaded on the workers it assigns
and kept loaded, without waiting for a request. `PinnedModels` takes the set the pool gate derives from each poll
of the gateway's pools and tells the worker: EnsureModelReady with `pin` True for each (again on every poll, so a
restarted worker child is pinned anew and a model evicted before its pin arrived is loaded again), `pin` False for
each model no pool pins any more (it stays loaded until evicted like any other). A model the worker cannot take now
is logged and tried again at the next poll.
"""

from __future__ import annotations

import logging

from sie.ipc.client import WorkerClient
from sie.wire.ipc_control import MODEL_STATE_FAILED, EnsureModelReadyRequest

logger = logging.getLogger(__name__)


class PinnedModels:
    """What this worker keeps loaded for the pools; `pinned` is the set last applied."""

    def __init__(self, worker: WorkerClient) -> None:
        self._worker = worker
        self.pinned: frozenset[str] = frozenset()

    async def keep(self, models: frozenset[str]) -> None:
        """Pin `models` on the worker and release those pinned before that are not among them."""
        for model in sorted(models):
            await self._tell(model, pin=True)
        for model in sorted(self.pinned - models):
            await self._tell(model, pin=False)
        if models != self.pinned:
            logger.info("pinned models: %s", ", ".join(sorted(models)) or "none")
        self.pinned = models

    async def _tell(self, model: str, *, pin: bool) -> None:
        try:
            answer = await self._worker.ensure_model_ready(EnsureModelReadyRequest(model_id=model, pin=pin))
        except Exception as exc:  # noqa: BLE001 - no child ready, an IPC failure: the next poll tries again
            logger.warning("pinning %s %s failed: %s", model, "on" if pin else "off", exc)
            return
        if pin and answer.state == MODEL_STATE_FAILED:
            logger.warning("pinned model %s cannot load: %s", model, answer.error or "failed")
