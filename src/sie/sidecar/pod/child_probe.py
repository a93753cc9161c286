"""What the fleet knows of each worker child, and one probe round's work on one child (seed 002 in this project):
ask its ModelControlStatus within the interval, give a child that (re)joined the config the others were given
since start, and turn the answer into placement's ChildReport. A child that fails the round is not ready; the
probe never raises. It owns no task: `sie.sidecar.pod.fleet` runs the rounds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import attrs

from sie.ipc.client import WorkerChild
from sie.placement.reports import ChildReport, ModelReport
from sie.sidecar.pod.children import ChildDirectory
from sie.wire.ipc_control import (
    MODEL_STATE_READY,
    ApplyModelConfigRequest,
    ModelControlStatusRequest,
    ModelControlStatusResponse,
    ReplaceModelConfigsRequest,
)

logger = logging.getLogger(__name__)

# A control call (Ping, EnsureModelReady, config) that takes longer than this counts as failed for that child.
CONTROL_TIMEOUT_S: Final = 10.0


@attrs.define
class ChildState:
    """What the fleet knows of one child between probe rounds."""

    name: str
    client: WorkerChild
    device: str = "unknown"
    ready: bool = False
    loaded: set[str] = attrs.Factory(set)
    report: ChildReport | None = None


class ConfigLog:
    """The config the fleet passed on since start: the last full replacement and each model's last delta
    after it, in order; replayed to a child that joins or restarts. One entry per model, so it stays small."""

    def __init__(self) -> None:
        self._replacement: ReplaceModelConfigsRequest | None = None
        self._deltas: dict[str, ApplyModelConfigRequest] = {}
        self.version = 0  # changes with every recorded request

    def replaced(self, request: ReplaceModelConfigsRequest) -> None:
        self._replacement, self._deltas = request, {}
        self.version += 1

    def applied(self, request: ApplyModelConfigRequest) -> None:
        self.version += 1
        self._deltas.pop(request.model_id, None)  # re-inserted last: replayed in the order applied
        self._deltas[request.model_id] = request

    def requests(self) -> list[ReplaceModelConfigsRequest | ApplyModelConfigRequest]:
        head = [self._replacement] if self._replacement is not None else []
        return [*head, *self._deltas.values()]

    async def replay_to(self, child: ChildState) -> bool:
        """Give a child that (re)joined the config the others were given since start; False if it failed."""
        try:
            replayed = None
            while replayed != self.version:  # a delta recorded meanwhile is replayed too
                replayed = self.version
                for request in self.requests():
                    async with asyncio.timeout(CONTROL_TIMEOUT_S):
                        if isinstance(request, ReplaceModelConfigsRequest):
                            await child.client.replace_model_configs(request)
                        else:
                            await child.client.apply_model_config(request)
        except Exception as exc:  # noqa: BLE001 - it stays unready and the next probe round tries again
            logger.warning("replaying the config to worker child %s failed: %s", child.name, exc)
            return False
        return True


async def probe_child(child: ChildState, directory: ChildDirectory, config: ConfigLog, timeout_s: float) -> None:
    """Refresh `child` from its ModelControlStatus; a probe that hangs past `timeout_s` redials the child."""
    try:
        async with asyncio.timeout(timeout_s):
            status = await child.client.model_control_status(ModelControlStatusRequest())
    except TimeoutError:
        child.ready = False
        child.report = unready_report(child)
        await directory.reconnect(child.name)
        return
    except Exception as exc:  # noqa: BLE001 - an unreachable child is simply not ready this round
        if child.ready:
            logger.warning("worker child %s stopped answering: %s", child.name, exc)
        child.ready = False
        child.report = unready_report(child)
        return
    became_ready = status.ready and not child.ready
    if became_ready and not await config.replay_to(child):
        status = attrs.evolve(status, ready=False)  # it serves no work on a config it has not got
    elif became_ready:
        logger.info("worker child %s (%s) is ready", child.name, status.device)
    child.device, child.ready = status.device, status.ready
    child.loaded = {entry.model_id for entry in status.models if entry.state == MODEL_STATE_READY}
    child.report = child_report(child.name, status)


def child_report(name: str, status: ModelControlStatusResponse) -> ChildReport:
    """The child's status as placement reads it."""
    models = {
        entry.model_id: ModelReport(
            model_id=entry.model_id,
            loaded=entry.state == MODEL_STATE_READY,
            memory_bytes=entry.memory_bytes,
            cost_per_item_s=entry.cost_per_item_s,
            max_batch_items=entry.max_batch_items,
            batched=entry.batched,
        )
        for entry in status.models
    }
    return ChildReport(
        name=name,
        device=status.device,
        ready=status.ready,
        compute_seconds_total=status.compute_seconds_total,
        memory_budget_bytes=status.memory_budget_bytes,
        models=models,
    )


def unready_report(child: ChildState) -> ChildReport:
    """A child that did not answer: its last known figures, not ready."""
    if child.report is None:
        return ChildReport(name=child.name, device=child.device, ready=False)
    return attrs.evolve(child.report, ready=False)
