"""How the worker children's answers read as one worker's (seed 002 in this project): the fleet asks several
children and answers the sidecar once, so pings, capabilities, config acknowledgements and EnsureModelReady
states are merged here, and a child's batch outcome is read for "given back" and device time. Pure: no I/O.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from sie.wire.ipc_batch import DISPOSITION_NAK_RETRY, BatchOutcome
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    ApplyModelConfigResponse,
    EnsureModelReadyResponse,
    PingRequest,
    PingResponse,
    ReplaceModelConfigsResponse,
    WorkerCapabilitiesResponse,
)


def merged_ping(request: PingRequest, pings: Sequence[PingResponse]) -> PingResponse:
    """Ready when any child is; loaded and loading models of all of them; the hash the ready ones agree on."""
    ready = [ping for ping in pings if ping.ready]
    loaded = sorted({model for ping in pings for model in ping.loaded_models})
    loading = sorted({model for ping in pings for model in ping.loading_models} - set(loaded))
    return PingResponse(
        timestamp_ms=request.timestamp_ms,
        worker_id=pings[0].worker_id if pings else "",
        ready=bool(ready),
        bundle_config_hash=agreed({ping.bundle_config_hash for ping in ready}),
        loaded_models=loaded,
        loading_models=loading,
        device_count=sum(ping.device_count or 0 for ping in pings),
        residency=[residency for ping in pings for residency in ping.residency or ()],
    )


def merged_capabilities(answers: Sequence[WorkerCapabilitiesResponse]) -> WorkerCapabilitiesResponse:
    """A protocol feature only when every child has it; models of any child."""
    return WorkerCapabilitiesResponse(
        supports_execution_authority_v1=all(answer.supports_execution_authority_v1 for answer in answers),
        supports_numerical_admission_v1=all(answer.supports_numerical_admission_v1 for answer in answers),
        has_generation_models=any(answer.has_generation_models for answer in answers),
        generation_models=sorted({model for answer in answers for model in answer.generation_models}),
        supported_models=sorted({model for answer in answers for model in answer.supported_models}),
        loaded_models=sorted({model for answer in answers for model in answer.loaded_models}),
    )


def merged_apply(answers: Sequence[ApplyModelConfigResponse]) -> ApplyModelConfigResponse:
    """Applied only when every child applied the delta; the hash only when they agree."""
    return ApplyModelConfigResponse(
        applied=all(answer.applied for answer in answers),
        bundle_config_hash=agreed({answer.bundle_config_hash for answer in answers}),
        config_version=max(answer.config_version for answer in answers),
        unsupported_models=sorted({model for answer in answers for model in answer.unsupported_models}),
    )


def merged_replacement(answers: Sequence[ReplaceModelConfigsResponse]) -> ReplaceModelConfigsResponse:
    """Applied only when every child applied the replacement; the hash only when they agree."""
    first = answers[0]
    return ReplaceModelConfigsResponse(
        applied=all(answer.applied for answer in answers),
        bundle_config_hash=agreed({answer.bundle_config_hash for answer in answers}),
        config_version=first.config_version,
        applied_models=first.applied_models,
        applied_profiles=first.applied_profiles,
        unsupported_models=sorted({model for answer in answers for model in answer.unsupported_models}),
    )


def agreed(hashes: set[str]) -> str:
    """The one hash every child reports; "" while they disagree (each child's own gate then decides)."""
    return next(iter(hashes)) if len(hashes) == 1 else ""


def most_ready(responses: Sequence[EnsureModelReadyResponse]) -> EnsureModelReadyResponse:
    """Ready if any child is; else loading if any is; else every child's failure agrees enough: the first."""
    by_state: dict[str, list[EnsureModelReadyResponse]] = collections.defaultdict(list)
    for response in responses:
        by_state[response.state].append(response)
    for state in (MODEL_STATE_READY, MODEL_STATE_LOADING_IN_PROGRESS, MODEL_STATE_LOADING_STARTED):
        if by_state[state]:
            return by_state[state][0]
    failed = by_state[MODEL_STATE_FAILED]
    if len(failed) == len(responses):
        return failed[0]
    return next(response for response in responses if response.state != MODEL_STATE_FAILED)


def given_back(outcome: BatchOutcome) -> bool:
    """Whether the child NAKed every item (model not loaded there, draining, another config)."""
    return bool(outcome.outcomes) and all(item.disposition == DISPOSITION_NAK_RETRY for item in outcome.outcomes)


def compute_seconds(outcome: BatchOutcome) -> float | None:
    """The device time the worker measured for the batch (every item carries the batch's inference time)."""
    if not outcome.outcomes or given_back(outcome):
        return None
    return outcome.outcomes[0].inference_ms / 1000.0 or None
