"""The lane consumer, the first stage: fetches deliveries in a loop (as many as admission has room for; a fetch
returns with the first delivery, so its wait only bounds how soon the loop sees `stop()`: a worker's
direct-dispatch consumer, mostly idle, waits longer), gives each its verdict, groups the rest
by model, NAKs work of a logical pool that does not assign this worker (the pool gate, seed 000 §16.3), admits
the rest, NAKs work for another config (the hash gate, seed 000 §2) and passes each group on to readiness. It
never tokenizes and never waits on a batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

import attrs

from sie.sidecar.admission import ADMISSION_NAK_DELAY_S, Admission
from sie.sidecar.hashgate import WorkerHash
from sie.sidecar.pool_admission import PoolGate
from sie.sidecar.results import unknown_operation_result
from sie.sidecar.settlement import Settler, Verdict, verdict
from sie.sidecar.token_ops import TOKEN_OPERATIONS
from sie.sidecar.work import AdmittedGroup, Outbox, Work
from sie.transport.base import Delivery, LaneConsumer, TransportError
from sie.wire.ipc_batch import OP_ENCODE, OP_EXTRACT, OP_SCORE
from sie.wire.queue import OPERATION_GENERATE

logger = logging.getLogger(__name__)

# One wait for every fetch, busy or idle. Each fetch returns with the first delivery, so a short wait would buy
# no latency: it would only end pull requests sooner, and work published between one request's end and the next
# one's arrival waits for it (measured under sequential load: a fifth of the requests, +0.3 ms each, with waits
# from 1 ms up).
FETCH_WAIT_S: Final = 0.1
# The direct-dispatch consumer is idle unless a capped pool targets this worker: a few pull requests a second
# then, still under the sidecar's one-second wait for its fetch loops to stop.
DIRECT_FETCH_WAIT_S: Final = 0.5
FETCH_ERROR_BACKOFF_S: Final = 0.5
OPERATIONS: Final = frozenset({OP_ENCODE, OP_SCORE, OP_EXTRACT, OPERATION_GENERATE, *TOKEN_OPERATIONS})


class Sorted:
    """One fetch sorted by verdict: work per model, and what is settled at once."""

    def __init__(self) -> None:
        self.by_model: dict[str, list[Work]] = {}
        self.drop: list[Work] = []
        self.nak: list[Work] = []
        self.unknown_op: list[Work] = []


def sort_deliveries(deliveries: list[Delivery], now: float) -> Sorted:
    """Verdicts first (unsafe reply: ACK-drop; malformed subject: NAK), then unknown operations, then models."""
    result = Sorted()
    for delivery in deliveries:
        work = Work(delivery, now)
        decision = verdict(delivery.subject, work.item.reply_subject)
        if decision is Verdict.ACK_DROP:
            result.drop.append(work)
        elif decision is Verdict.NAK:
            result.nak.append(work)
        elif work.item.operation not in OPERATIONS:
            result.unknown_op.append(work)
        else:
            result.by_model.setdefault(work.model_id, []).append(work)
    return result


@attrs.frozen
class ConsumerOptions:
    """Fetch size, the NAK delay of malformed or refused deliveries, the worker id stamped on direct replies, the
    pool admission gate (None: every item's pool is admitted) and how long a fetch waits for its first delivery."""

    fetch_budget: int
    nak_delay_s: float
    worker_id: str
    pools: PoolGate | None = None
    fetch_wait_s: float = FETCH_WAIT_S


class Consumer:
    """The fetch loop of one lane consumer; admitted work of the worker's config goes to `out` (readiness)."""

    def __init__(
        self,
        lane: LaneConsumer,
        admission: Admission,
        settler: Settler,
        gate: WorkerHash,
        out: Outbox[AdmittedGroup],
        options: ConsumerOptions,
    ) -> None:
        self._lane = lane
        self._admission = admission
        self._settler = settler
        self._gate = gate
        self._out = out
        self._fetch_budget = max(1, options.fetch_budget)
        self._worker_id = options.worker_id
        self._pools = options.pools
        self.nak_delay_s = options.nak_delay_s
        self._fetch_wait_s = options.fetch_wait_s
        self._stopping = False
        self.fetched = 0
        self.refused = 0

    def stop(self) -> None:
        """Fetch no more; the loop ends after the fetch in progress."""
        self._stopping = True

    async def run(self) -> None:
        while not self._stopping:
            room = min(self._fetch_budget, self._admission.free())
            if room <= 0:
                await self._admission.wait_capacity()
                continue
            try:
                deliveries = await self._lane.fetch(room, self._fetch_wait_s)
            except TransportError as exc:  # the broker away or electing a leader: expected, one line says it
                logger.warning("fetch failed (%s); retrying in %.1f s", exc, FETCH_ERROR_BACKOFF_S)
                await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                continue
            except Exception:  # noqa: BLE001 - a broker hiccup must not end the lane; back off and retry
                logger.warning("fetch failed; retrying in %.1f s", FETCH_ERROR_BACKOFF_S, exc_info=True)
                await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                continue
            if deliveries:
                self.fetched += len(deliveries)
                await self.accept(deliveries)
                # The stage just fed runs before this loop builds its next pull request (about 0.1 ms of Python
                # on a broker): a lone request reaches the worker that much sooner.
                await asyncio.sleep(0)

    async def accept(self, deliveries: list[Delivery]) -> None:
        """Settle what needs no work, admit the rest per model and pass it on to readiness."""
        batch = sort_deliveries(deliveries, time.monotonic())
        if batch.drop:
            await self._settler.ack_drop(batch.drop)
        if batch.nak:
            await self._settler.nak(batch.nak, self.nak_delay_s)
        if batch.unknown_op:
            await self._settler.reply(
                [(w, unknown_operation_result(w.item, self._worker_id)) for w in batch.unknown_op]
            )
        for model_id, works in batch.by_model.items():
            if self._pools is not None:
                works = await self._pool_admitted(works)
            admitted, refused = self._admission.admit(model_id, works)
            if refused:
                await self._settler.nak(refused, ADMISSION_NAK_DELAY_S)
            if admitted:
                await self._pass_on(model_id, admitted)

    async def _pool_admitted(self, works: list[Work]) -> list[Work]:
        """The works whose pool assigns this worker; the others are NAKed for another worker of the lane."""
        if self._pools is None:
            return works
        admitted, refused = self._pools.split(works)
        if refused:
            await self._settler.nak(refused, self.nak_delay_s)
        return admitted

    async def _pass_on(self, model_id: str, works: list[Work]) -> None:
        """Abandoned work is ACK-dropped and deliveries for another config NAKed before any IPC for them; the
        rest go to readiness."""
        proceed, refuse = await self._gate.split(await self._settler.live(works))
        if refuse:
            self.refused += len(refuse)
            logger.info("NAKing %d items of %s for a bundle_config_hash other than the worker's %r",
                        len(refuse), model_id, self._gate.current)  # fmt: skip
            await self._settler.nak(refuse, self.nak_delay_s)
        if proceed:
            await self._out.put((model_id, proceed))
