"""The sidecar: consumes one lane, tokenizes, forms cost-bounded batches, dispatches them to workers, settles.
`live_config` owns the config the workers acknowledged; `pod/` is the pod's side (worker children, health, probes).
"""

from sie.sidecar.sidecar import Sidecar, SidecarConfig, WorkerHooks

__all__ = ["Sidecar", "SidecarConfig", "WorkerHooks"]
