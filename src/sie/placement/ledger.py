"""What placement has sent and measured: the batches in flight on each child and each (model, child), the
batches and items routed, the items-per-batch histograms, each model's measured cost per batch, and the
demand average (seed 002: an EMA whose halflife is counted in fleet compute-seconds, not wall time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

# Upper bounds of the items-per-batch histogram; the last one catches everything.
BATCH_SIZE_BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, math.inf)
# Weight of one finished batch in a model's mean cost per batch: about the last 20 batches count.
_COST_PER_BATCH_WEIGHT = 0.05


@attrs.frozen
class Ticket:
    """One batch sent to a child: what `started` charged, so that `finished` releases exactly that.

    `units` are the items counted (one for a model with no batch axis); `compute` the in-flight compute
    charged (units × cost per item); `request_cost` the per-request cost charged (fill_least under `requests`).
    """

    number: int
    child: str
    model_id: str
    items: int
    units: int
    compute: float
    request_cost: float


@attrs.define
class Load:
    """Work in flight: batches, items (units), compute-seconds and per-request cost."""

    batches: int = 0
    items: int = 0
    compute: float = 0.0
    request_cost: float = 0.0

    def add(self, ticket: Ticket, sign: int) -> None:
        self.batches += sign
        self.items += sign * ticket.units
        self.compute += sign * ticket.compute
        self.request_cost += sign * ticket.request_cost
        if self.batches == 0:  # float sums drift; nothing in flight is exactly zero
            self.compute = self.request_cost = 0.0


@attrs.define
class Routed:
    """Batches and items sent to one replica since start."""

    batches: int = 0
    items: int = 0


class Ledger:
    """In-flight and routed accounting, batch-size histograms and per-model compute measurements."""

    def __init__(self) -> None:
        self._next_ticket = 0
        self._open: set[int] = set()
        self._child_load: dict[str, Load] = {}
        self._replica_load: dict[tuple[str, str], Load] = {}
        self._model_items: dict[str, int] = {}
        self._routed: dict[tuple[str, str], Routed] = {}
        self._sizes: dict[tuple[str, str], list[int]] = {}
        self._size_items: dict[tuple[str, str], int] = {}
        self._cost_per_batch: dict[str, float] = {}
        self._demand: dict[str, float] = {}

    def start(self, child: str, model_id: str, items: int, units: int, cost: tuple[float, float]) -> Ticket:
        """Charge one batch to `child`; `cost` is (compute, per-request cost) as the router priced it."""
        self._next_ticket += 1
        ticket = Ticket(self._next_ticket, child, model_id, items, units, cost[0], cost[1])
        self._open.add(ticket.number)
        self._child_load.setdefault(child, Load()).add(ticket, 1)
        self._replica_load.setdefault((model_id, child), Load()).add(ticket, 1)
        self._model_items[model_id] = self._model_items.get(model_id, 0) + units
        routed = self._routed.setdefault((model_id, child), Routed())
        routed.batches += 1
        routed.items += items
        return ticket

    def finish(self, ticket: Ticket, compute_seconds: float | None) -> None:
        """Release the ticket's charge and record its batch size, and its compute when measured."""
        if ticket.number not in self._open:
            raise RuntimeError(f"placement ticket {ticket.number} finished twice or never started; this is a bug")
        self._open.discard(ticket.number)
        self._child_load[ticket.child].add(ticket, -1)
        self._replica_load[(ticket.model_id, ticket.child)].add(ticket, -1)
        self._model_items[ticket.model_id] -= ticket.units
        key = (ticket.child, ticket.model_id)
        counts = self._sizes.setdefault(key, [0] * len(BATCH_SIZE_BOUNDS))
        counts[next(i for i, bound in enumerate(BATCH_SIZE_BOUNDS) if ticket.items <= bound)] += 1
        self._size_items[key] = self._size_items.get(key, 0) + ticket.items
        if compute_seconds is not None:
            self._measure(ticket.model_id, compute_seconds)

    def _measure(self, model_id: str, compute_seconds: float) -> None:
        compute = max(0.0, compute_seconds)
        self._demand[model_id] = self._demand.get(model_id, 0.0) + compute
        mean = self._cost_per_batch.get(model_id)
        self._cost_per_batch[model_id] = compute if mean is None else mean + _COST_PER_BATCH_WEIGHT * (compute - mean)

    def child_load(self, child: str) -> Load:
        return self._child_load.get(child, Load())

    def replica_load(self, model_id: str, child: str) -> Load:
        return self._replica_load.get((model_id, child), Load())

    def model_items_in_flight(self, model_id: str) -> int:
        return self._model_items.get(model_id, 0)

    def routed(self, model_id: str, child: str) -> Routed:
        return self._routed.get((model_id, child), Routed())

    def models(self) -> set[str]:
        """Every model ever routed."""
        return {model for model, _ in self._routed}

    def batch_sizes(self) -> Mapping[tuple[str, str], list[int]]:
        """Per (child, model): the count of batches in each BATCH_SIZE_BOUNDS bucket (not cumulative)."""
        return self._sizes

    def batch_items(self, child: str, model_id: str) -> int:
        """Items in the batches the histogram of (child, model) counts."""
        return self._size_items.get((child, model_id), 0)

    def cost_per_batch(self, model_id: str) -> float | None:
        """The model's recent mean compute-seconds per batch (None until one finished with a measurement)."""
        return self._cost_per_batch.get(model_id)

    def mean_cost_per_batch(self) -> float | None:
        costs = list(self._cost_per_batch.values())
        return sum(costs) / len(costs) if costs else None

    def decay_demand(self, consumed: float, halflife: float) -> None:
        """Age every model's demand by `consumed` fleet compute-seconds (halving every `halflife`)."""
        if consumed <= 0 or halflife <= 0:
            return
        factor = 0.5 ** (consumed / halflife)
        for model_id in self._demand:
            self._demand[model_id] *= factor

    def demand(self) -> Mapping[str, float]:
        """Each measured model's decayed compute-seconds; shares of their sum are the demand estimate."""
        return self._demand
