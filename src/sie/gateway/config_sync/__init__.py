"""Gateway config sync (seed 000 §4–§6), in four modules: `state` (the registry the gateway reads), `remote` (the
config service's read API), `sync` (bootstrap, the epoch poller, live deltas and the `ConfigSync` component that runs
them) and `views` (the pure bodies of the config read routes). No web framework here; `gateway.config_routes` serves it.
"""

from sie.catalog.trust import is_trusted_producer
from sie.gateway.config_sync.remote import ConfigServiceClient, ConfigServiceError, RemoteEpoch
from sie.gateway.config_sync.state import ConfigEpoch, ConfigState, DeltaRejectedError, ModelSource
from sie.gateway.config_sync.sync import (
    BackoffPolicy,
    Bootstrap,
    BootstrapOutcome,
    ConfigSync,
    DeltaOutcome,
    DeltaSubscriber,
    PartialApplyError,
    Poller,
    PollOutcome,
    StateRealigner,
    drifted,
)
from sie.gateway.config_sync.views import ConfigView, HeartbeatSource, StaticConfigView, worker_ack_status

__all__ = [
    "BackoffPolicy",
    "Bootstrap",
    "BootstrapOutcome",
    "ConfigEpoch",
    "ConfigServiceClient",
    "ConfigServiceError",
    "ConfigState",
    "ConfigSync",
    "ConfigView",
    "DeltaOutcome",
    "DeltaRejectedError",
    "DeltaSubscriber",
    "HeartbeatSource",
    "ModelSource",
    "PartialApplyError",
    "PollOutcome",
    "Poller",
    "RemoteEpoch",
    "StateRealigner",
    "StaticConfigView",
    "drifted",
    "is_trusted_producer",
    "worker_ack_status",
]
