"""Gateway config sync (seed 000 §4–§6): the registry the gateway reads, bootstrap, the epoch poller, live
deltas, and the pure bodies of the config read routes. No web framework here; `gateway.config_routes` serves it.
"""

from sie.gateway.config_sync.ack import HeartbeatSource, worker_ack_status
from sie.gateway.config_sync.bootstrap import BackoffPolicy, Bootstrap
from sie.gateway.config_sync.client import ConfigServiceClient, ConfigServiceError, RemoteEpoch
from sie.gateway.config_sync.component import ConfigSync
from sie.gateway.config_sync.deltas import DeltaOutcome, DeltaSubscriber, is_trusted_producer
from sie.gateway.config_sync.poller import Poller, PollOutcome, drifted
from sie.gateway.config_sync.state import ConfigEpoch, ConfigState, DeltaRejectedError, ModelSource
from sie.gateway.config_sync.sync import BootstrapOutcome, ConfigSyncer, PartialApplyError
from sie.gateway.config_sync.views import ConfigView, StaticConfigView

__all__ = [
    "BackoffPolicy",
    "Bootstrap",
    "BootstrapOutcome",
    "ConfigEpoch",
    "ConfigServiceClient",
    "ConfigServiceError",
    "ConfigState",
    "ConfigSync",
    "ConfigSyncer",
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
    "StaticConfigView",
    "drifted",
    "is_trusted_producer",
    "worker_ack_status",
]
