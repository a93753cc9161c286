"""The sidecar's series (seed 001 "Readiness, Health, And Telemetry"): what each batch was (tokens, fill) and where
its time went (queue, tokenization, inference), admission of deliveries, the bytes and chunked responses of the
sidecar ↔ worker IPC, how results reached the gateway (whole, chunked, too large), and the local-ingest socket's
connections and refusals.

Recorded once per batch, per fetch, per IPC frame or per result, never per token. Items per batch are the
placement layer's `sie_worker_batch_items` (by model, worker child and device), not repeated here.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from sie.telemetry.metrics import Distribution, ModelLabels, Tally, Telemetry

SECONDS_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS: Final = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
FILL_BUCKETS: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Admission(enum.StrEnum):
    """What the sidecar did with a delivery at admission (before tokenization)."""

    ADMITTED = "admitted"
    REFUSED = "refused"  # over the per-model pending cap: NAKed for another worker
    POOL_REFUSED = "pool_refused"  # its admission_pool does not assign this worker (seed 000 §16.3): NAKed


class IpcDirection(enum.StrEnum):
    SENT = "sent"
    RECEIVED = "received"


class IpcChunks(enum.StrEnum):
    """How a chunked IPC response transfer ended (seed 001 "IPC": sie.worker.ipc.response.chunks)."""

    COMPLETED = "completed"
    PROTOCOL_ERROR = "protocol_error"
    BUDGET_REJECTED = "budget_rejected"


class ResultTransport(enum.StrEnum):
    """How one item's result reached the gateway (seed 001 "Preparation And Framing")."""

    WHOLE = "whole"
    CHUNKED = "chunked"
    TOO_LARGE = "too_large"


class LocalConnection(enum.StrEnum):
    """What became of a connection to the local-ingest socket."""

    ACCEPTED = "accepted"
    REFUSED = "refused"  # over SIE_LOCAL_INGEST_MAX_CONNECTIONS
    PROTOCOL_ERROR = "protocol_error"  # closed for a frame over the limit, malformed or with a duplicate id
    SLOW_READER = "slow_reader"  # closed because its client did not read its results in time


class LocalRefusal(enum.StrEnum):
    """Why the items of a local-ingest submit were refused."""

    INVALID_INPUT = "invalid_input"  # malformed, another lane, a generation
    QUEUE_FULL = "queue_full"  # over the connection's in-flight items (SIE_LOCAL_INGEST_MAX_INFLIGHT_ITEMS)


@attrs.frozen
class BatchRecord:
    """One dispatched batch: its model, size and timings in seconds."""

    model_id: str
    tokens: int  # padded cost: longest item × items (what the budget counts)
    fill: float  # the share of the batch's budget it used, of items or tokens whichever binds, 0-1
    queue_s: float  # from publish to dispatch, of the batch's oldest item
    tokenization_s: float  # the sidecar's tokenization of the batch's slowest item
    round_trip_s: float  # the RunBatch call: IPC both ways and the worker's time
    inference_s: float | None  # the worker's model time for the batch (None: the call failed)


class FetchOutcome(enum.StrEnum):
    """What became of reading an offloaded payload back (`PayloadResolver`)."""

    FETCHED = "fetched"
    OVER_LIMIT = "over_limit"  # over SIE_PAYLOAD_FETCH_MAX_BYTES
    MISSING = "missing"  # gone from the store
    STORE_ERROR = "store_error"
    MALFORMED = "malformed"
    NO_STORE = "no_store"  # this worker has no payload store configured


class SidecarMetrics:
    """Batches, admission, IPC and result transport of one sidecar (or of the `all` role's)."""

    def __init__(self, telemetry: Telemetry, models: ModelLabels | None = None) -> None:
        self._models = models if models is not None else ModelLabels()
        meter = telemetry.meter
        # Batches by model and whether the RunBatch call came back (`ok`; items may still fail one by one) or
        # failed whole (its items NAKed): the dispatch rate and the IPC failures.
        self._batches = Tally(meter, "sie.worker.batches", "{batch}", "RunBatch calls by result.", ("model", "result"))
        # Offloaded payloads read back from the payload store, by outcome (fetched, or why not).
        self._payload_fetches = Tally(meter, "sie.worker.payload.fetches", "{item}",
                                      "Offloaded payloads read back, by outcome.", ("outcome",))  # fmt: skip
        # How deep batches are in the unit the budget counts (SIE_MAX_BATCH_TOKENS): padding shows here.
        self._tokens = _histogram(
            telemetry, "sie.worker.batch.tokens", "{token}", "Padded tokens per batch.", TOKEN_BUCKETS
        )
        # Whether batching works: near 1 under load, low when batches leave early or traffic is thin.
        self._fill = _histogram(
            telemetry, "sie.worker.batch.fill", "1", "Share of the batch budget used.", FILL_BUCKETS
        )
        # Where a request's time goes inside a worker pod (the X-Queue/Tokenization/Inference-Time headers' sums).
        self._queue = _histogram(
            telemetry, "sie.worker.queue.duration", "s", "Publish to dispatch, oldest item of a batch.", SECONDS_BUCKETS
        )
        self._tokenization = _histogram(
            telemetry,
            "sie.worker.tokenization.duration",
            "s",
            "Tokenization, longest item of a batch.",
            SECONDS_BUCKETS,
        )
        self._inference = _histogram(
            telemetry, "sie.worker.inference.duration", "s", "Model time of a batch on the worker.", SECONDS_BUCKETS
        )
        # The RunBatch call as the sidecar waits for it: its excess over inference is IPC and worker queueing.
        self._round_trip = _histogram(
            telemetry, "sie.worker.batch.duration", "s", "RunBatch round trip of a batch.", SECONDS_BUCKETS
        )
        # Deliveries refused for the per-model pending cap (SIE_MAX_PENDING_ITEMS): a lane fetching more than its
        # worker keeps up with; or by the pool admission gate: logical-pool work reaching a worker not assigned to it.
        self._admission = Tally(
            meter, "sie.worker.admission.decisions", "{item}", "Deliveries at admission.", ("decision",)
        )
        # The IPC's traffic: what moving tensors between sidecar and worker costs.
        self._ipc_bytes = Tally(meter, "sie.worker.ipc", "By", "IPC frame bytes by direction.", ("direction",))
        self._ipc_chunks = Tally(
            meter, "sie.worker.ipc.response.chunks", "{transfer}", "Chunked IPC responses by outcome.", ("outcome",)
        )
        # Results over the broker's max_payload: chunked, or answered PAYLOAD_TOO_LARGE.
        self._results = Tally(
            meter, "sie.worker.results", "{result}", "Results published by how they travelled.", ("transport",)
        )

        # Local ingest (SIE_LOCAL_INGEST_SOCKET): who connects, who is turned away, and what producers send that is
        # refused, the socket's only failures that no result reports.
        self._local_connections = Tally(meter, "sie.worker.local_ingest.connections", "{connection}",
                                        "Local-ingest connections by outcome.", ("outcome",))  # fmt: skip
        self._local_refused = Tally(meter, "sie.worker.local_ingest.refused", "{item}",
                                    "Local-ingest items refused, by reason.", ("reason",))  # fmt: skip

    def batch(self, record: BatchRecord) -> None:
        model = self._models(record.model_id)
        self._batches.add((model, "failed" if record.inference_s is None else "ok"))
        labels = (model,)
        self._tokens.record(record.tokens, labels)
        self._fill.record(record.fill, labels)
        self._queue.record(record.queue_s, labels)
        self._tokenization.record(record.tokenization_s, labels)
        self._round_trip.record(record.round_trip_s, labels)
        if record.inference_s is not None:
            self._inference.record(record.inference_s, labels)

    def payload_fetch(self, outcome: FetchOutcome) -> None:
        self._payload_fetches.add((outcome.value,))

    def admission(self, decision: Admission, items: int) -> None:
        if items:
            self._admission.add((decision.value,), items)

    def ipc_bytes(self, direction: IpcDirection, size: int) -> None:
        self._ipc_bytes.add((direction.value,), size)

    def ipc_chunks(self, outcome: IpcChunks) -> None:
        self._ipc_chunks.add((outcome.value,))

    def result(self, transport: ResultTransport) -> None:
        self._results.add((transport.value,))

    def local_connection(self, outcome: LocalConnection) -> None:
        self._local_connections.add((outcome.value,))

    def local_refused(self, reason: LocalRefusal, items: int) -> None:
        self._local_refused.add((reason.value,), items)


def _histogram(
    telemetry: Telemetry, name: str, unit: str, description: str, buckets: tuple[float, ...]
) -> Distribution:
    return telemetry.distribution(name, unit, description, ("model",), buckets)
