"""The sidecar: consumes one lane, tokenizes, forms cost-bounded batches, dispatches them to workers, settles."""

from sie.sidecar.sidecar import Sidecar, SidecarConfig, WorkerHooks

__all__ = ["Sidecar", "SidecarConfig", "WorkerHooks"]
