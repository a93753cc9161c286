"""`--role all`: the gateway's ModelStatusSource answered from the in-process worker's model manager."""

from __future__ import annotations

from collections.abc import Sequence

from sie.gateway.status import LastError, WorkerSummary
from sie.settings import LaneSettings
from sie.worker.manager import ModelManager


class LocalModelStatus:
    """Model states straight from the manager; the one local worker as the only worker."""

    def __init__(self, manager: ModelManager, worker_id: str, lane: LaneSettings) -> None:
        self.manager = manager
        self.worker_id = worker_id
        self.lane = lane

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        status = self.manager.status(model_id)
        failure = status.last_error
        last_error = (
            LastError(failure.error_class, failure.message, failure.attempts, failure.permanent) if failure else None
        )
        return str(status.state), last_error

    def workers(self) -> Sequence[WorkerSummary]:
        lane = self.lane
        return [
            WorkerSummary(
                name=self.worker_id,
                pool=lane.pool,
                machine_profile=lane.machine_profile,
                bundle=lane.bundle,
                loaded_models=tuple(self.manager.loaded_models),
            )
        ]
