"""`--role all`: the gateway's ModelStatusSource answered from the in-process worker children's model managers."""

from __future__ import annotations

from collections.abc import Sequence

from sie.gateway.status import LastError, WorkerSummary
from sie.roles.common import LocalWorker
from sie.settings import LaneSettings
from sie.worker.manager import ModelState, ModelStatus

# When children disagree, a model shows the state of the child furthest along: loaded anywhere is loaded.
_PRECEDENCE = (ModelState.LOADED, ModelState.LOADING, ModelState.UNLOADING, ModelState.AVAILABLE, ModelState.FAILED)


class LocalModelStatus:
    """Model states straight from the children's managers; each child listed as a worker."""

    def __init__(self, workers: Sequence[LocalWorker], lane: LaneSettings) -> None:
        self.children = tuple(workers)
        self.lane = lane

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        status = _furthest([worker.manager.status(model_id) for worker in self.children])
        failure = status.last_error
        last_error = (
            LastError(failure.error_class, failure.message, failure.attempts, failure.permanent) if failure else None
        )
        return str(status.state), last_error

    def workers(self) -> Sequence[WorkerSummary]:
        lane = self.lane
        return [
            WorkerSummary(
                name=worker.service.worker_id,
                pool=lane.pool,
                machine_profile=lane.machine_profile,
                bundle=lane.bundle,
                gpu_count=1 if worker.device.startswith("cuda") else 0,
                loaded_models=tuple(worker.manager.loaded_models),
            )
            for worker in self.children
        ]


def _furthest(statuses: Sequence[ModelStatus]) -> ModelStatus:
    return min(statuses, key=lambda status: _PRECEDENCE.index(status.state))
