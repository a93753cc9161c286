"""The worker children of one pod as one WorkerClient (seed 002 in this project: DESIGN §2, §3 `placement/`).

The sidecar's stages talk to `WorkerFleet` exactly as they talked to a single worker. Behind it:

- every probe round (SIE_PLACEMENT_PROBE_INTERVAL_S) each child found by the `ChildDirectory` is asked for
  its `ModelControlStatus` (device, readiness, loaded models, cost per item, max batch, memory, consumed
  compute); the answers replace placement's table in one step. A probe that hangs past the interval drops
  and recreates that child's connection.
- `run_batch` asks placement for the child, among those that have the model loaded, and fails the batch
  over to another replica when the child fails the call or gives the whole batch back; with no replica
  left the batch fails and the dispatcher NAKs it for redelivery.
- `process_generate` runs a generation on the child placement picks the same way (one item), yielding that
  child's events; a child that fails before its first event hands it to another replica. `signal_generate_cancel`
  asks every ready child (the generation runs on one of them) and matches if any does.
- `ensure_model_ready` loads the model on the children placement assigns it to and answers ready as soon
  as one of them is; children assigned a model later (a repack, `replicas` raised, a restarted child) are
  warmed in the background on the next probe round.
- after a repack, compaction (SIE_PLACEMENT_COMPACTION_*) unloads each model from the children that no longer hold a
  replica of it, once its new replicas serve: the child stops getting its batches at once and unloads it when the
  ones running there end (`sie.placement.compaction` says which and when).
- config deltas, full replacements and drains go to every child; readiness is "at least one child ready".

It also implements the placement control surface (`sie.placement.api.PlacementControl`): snapshot, per-model
overrides, policy knobs and a repack that can wait for the new replicas. One child's probe and the config replay
are in `sie.sidecar.pod.child_probe`; how the children's answers merge into one is in `sie.sidecar.pod.answers`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Final, Self, TypeVar

from sie.ipc.client import WorkerChild, WorkerClient, close_events
from sie.ipc.errors import IpcConnectionError
from sie.placement.policy import ModelOverride, PlacementPolicy, policy_from_settings
from sie.placement.router import Placement
from sie.placement.snapshot import PlacementSnapshot, RepackRecord
from sie.runtime.periodic import Outage, PeriodicTask
from sie.settings import PlacementSettings
from sie.sidecar.pod.answers import (
    compute_seconds,
    given_back,
    merged_apply,
    merged_capabilities,
    merged_ping,
    merged_replacement,
    most_ready,
)
from sie.sidecar.pod.child_probe import CONTROL_TIMEOUT_S, ChildState, ConfigLog, probe_child
from sie.sidecar.pod.children import ChildDirectory
from sie.telemetry.exposition import ChildSource
from sie.wire.generate import GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc_batch import BatchOutcome, RunBatchRequest
from sie.wire.ipc_control import (
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_LOADING_STARTED,
    MODEL_STATE_READY,
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    PingRequest,
    PingResponse,
    ReplaceModelConfigsRequest,
    ReplaceModelConfigsResponse,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
    UnloadModelRequest,
    WorkerCapabilitiesRequest,
    WorkerCapabilitiesResponse,
    WorkerMetricsRequest,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long an unload may wait for the batches running on the child to end before the next probe round retries it.
UNLOAD_TIMEOUT_S: Final = 120.0
# How often a repack with `wait` checks whether the new replicas are ready.
_REPACK_POLL_S: Final = 0.2
_LOADING: Final = (MODEL_STATE_LOADING_STARTED, MODEL_STATE_LOADING_IN_PROGRESS)


class NoWorkerChild(IpcConnectionError):
    """No ready child can take the call now; the caller treats it like a lost connection (NAK, retry)."""


class WorkerFleet:
    """One pod's worker children behind the WorkerClient protocol, placed by `placement`.

    `async with` discovers and probes the children once, then keeps probing every `probe_interval_s`.
    """

    def __init__(
        self,
        directory: ChildDirectory,
        placement: Placement,
        probe_interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.placement = placement
        self.probe_interval_s = probe_interval_s
        self.clock = clock
        self._children: dict[str, ChildState] = {}
        # Models the sidecar asked for: the fleet keeps them loaded where placement assigns them.
        self._wanted: set[str] = set()
        self._warming: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._unloading: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._config = ConfigLog()
        probing = Outage("probing the worker children", logger)
        self._probing = PeriodicTask(self.probe, lambda: self.probe_interval_s, probing)  # off the request path
        self.probe_rounds = 0

    @classmethod
    def from_settings(cls, directory: ChildDirectory, settings: PlacementSettings) -> WorkerFleet:
        """The fleet of `directory`'s children placed by the SIE_PLACEMENT_* policy (and its file)."""
        return cls(directory, Placement(policy_from_settings(settings)), settings.probe_interval_s)

    async def __aenter__(self) -> Self:
        await self.probe()  # a pod whose children cannot be probed at all does not start
        await self._probing.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._probing.__aexit__(*exc_info)
        tasks = [*self._warming.values(), *self._unloading.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._warming.clear()
        self._unloading.clear()
        await self.directory.aclose()

    @property
    def ready(self) -> bool:
        """At least one child is ready (seed 002 "Readiness probe")."""
        return any(child.ready for child in self._children.values())

    @property
    def size(self) -> int:
        """Children found at the last probe round."""
        return len(self._children)

    def replicas(self, model_id: str) -> int:
        """How many children can run this model's batches at once (at least 1)."""
        return max(1, len(self._candidates(model_id)))

    # --- probing ----------------------------------------------------------------------------------

    async def probe(self) -> None:
        """One probe round: discover the children, ask each for its status, swap placement's table."""
        found = await self.directory.discover()
        children: dict[str, ChildState] = {}
        for name, client in found.items():
            known = self._children.get(name)
            children[name] = known if known is not None and known.client is client else ChildState(name, client)
        self._children = children
        await asyncio.gather(
            *(probe_child(child, self.directory, self._config, self.probe_interval_s) for child in children.values())
        )
        reports = [child.report for child in children.values() if child.report is not None]
        self.placement.update(reports)
        self.probe_rounds += 1
        self._warm()
        self._compact()

    def _warm(self) -> None:
        """Start loading each wanted model on every assigned child that has not got it."""
        for model_id in self._wanted:
            for name in self.placement.assigned(model_id):
                child = self._children.get(name)
                key = (name, model_id)
                if child is None or not child.ready or model_id in child.loaded or key in self._warming:
                    continue
                task = asyncio.get_running_loop().create_task(self._ensure_on(child, model_id))
                self._warming[key] = task
                task.add_done_callback(lambda _, key=key: self._warming.pop(key, None))

    def _compact(self) -> None:
        """Start unloading each (child, model) compaction names; no new batch of the model goes to that child."""
        for name, model_id in self.placement.compaction_due():
            child = self._children.get(name)
            key = (name, model_id)
            if child is None or key in self._unloading:
                continue
            child.loaded.discard(model_id)
            task = asyncio.get_running_loop().create_task(self._unload_on(child, model_id))
            self._unloading[key] = task
            task.add_done_callback(lambda _, key=key: self._unloading.pop(key, None))

    async def _unload_on(self, child: ChildState, model_id: str) -> None:
        """Unload one model from one child (after the batches running there), and tell placement how it went."""
        try:
            async with asyncio.timeout(UNLOAD_TIMEOUT_S):
                answer = await child.client.unload_model(UnloadModelRequest(model_id=model_id))
        except Exception as exc:  # noqa: BLE001 - the next probe round names it again
            logger.warning("compaction: unloading %s from %s failed: %s", model_id, child.name, exc)
            return
        if answer.unloaded:
            logger.info("compaction: unloaded %s from %s (no replica there since the last repack), %d bytes freed",
                        model_id, child.name, answer.memory_freed_bytes)  # fmt: skip
            self.placement.compacted(child.name, model_id, answer.memory_freed_bytes)
        else:
            logger.info("compaction: %s stays loaded on %s (%s)", model_id, child.name, answer.reason)
            self.placement.compacted(child.name, model_id, None)

    # --- the WorkerClient methods -------------------------------------------------------------------

    async def ping(self, request: PingRequest) -> PingResponse:
        answers = await self._each(lambda client: client.ping(request), self._children.values())
        return merged_ping(request, [answer for answer in answers.values() if isinstance(answer, PingResponse)])

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        model_id = request.model_id
        self._wanted.add(model_id)
        hosts = [self._children[name] for name in self.placement.assigned(model_id) if name in self._children]
        hosts = [child for child in hosts if child.ready] or [c for c in self._children.values() if c.ready]
        if not hosts:
            raise NoWorkerChild(f"no worker child is ready to load {model_id}")
        answers = await self._each(lambda client: client.ensure_model_ready(request), hosts)
        responses: list[EnsureModelReadyResponse] = []
        for child in hosts:
            answer = answers.get(child.name)
            if not isinstance(answer, EnsureModelReadyResponse):
                continue
            if answer.state == MODEL_STATE_READY:
                child.loaded.add(model_id)
            responses.append(answer)
        if not responses:
            raise NoWorkerChild(f"no worker child answered EnsureModelReady({model_id})")
        return most_ready(responses)

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        model_id, items = request.model_id, len(request.items)
        tried: set[str] = set()
        outcome: BatchOutcome | None = None
        while True:
            candidates = [name for name in self._candidates(model_id) if name not in tried]
            name = self.placement.choose(model_id, items, candidates)
            if name is None:
                break
            tried.add(name)
            child = self._children[name]
            ticket = self.placement.started(name, model_id, items)
            compute_s: float | None = None
            try:
                outcome = await child.client.run_batch(request)
                compute_s = compute_seconds(outcome)
            except Exception as exc:  # noqa: BLE001 - the child failed the call: fail over to another replica
                logger.warning("RunBatch %d of %s failed on %s (%s); trying another replica",
                               request.batch_id, model_id, name, exc)  # fmt: skip
                child.loaded.discard(model_id)
                continue
            finally:
                self.placement.finished(ticket, compute_s)
            if not given_back(outcome):
                return outcome
            child.loaded.discard(model_id)  # not loaded there after all, or draining: another replica may run it
        if outcome is not None:
            return outcome  # every replica gave it back: their reasons and delays settle it
        raise NoWorkerChild(f"no worker child has {model_id} ready for batch {request.batch_id}")

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        """The generation's events from the child placement picks among those with the model loaded.

        Before the first event a failed child hands the generation to another replica (nothing was published
        yet); after it, the failure ends the stream. NoWorkerChild when no replica has the model ready.
        """
        model_id = request.model_id
        tried: set[str] = set()
        failure: Exception | None = None
        while True:
            candidates = [name for name in self._candidates(model_id) if name not in tried]
            name = self.placement.choose(model_id, 1, candidates)
            if name is None:
                break
            tried.add(name)
            child = self._children[name]
            ticket = self.placement.started(name, model_id, 1)
            events = child.client.process_generate(request)
            started = False
            try:
                async for event in events:
                    started = True
                    yield event
                return
            except Exception as exc:  # noqa: BLE001 - before any event: another replica may run it
                if started:
                    raise
                logger.warning("ProcessGenerate of %s failed on %s (%s); trying another replica", model_id, name, exc)
                child.loaded.discard(model_id)
                failure = exc
            finally:
                await close_events(events)  # left early: the child cancels the generation
                self.placement.finished(ticket)
        if failure is not None:
            raise failure
        raise NoWorkerChild(f"no worker child has {model_id} ready for a generation")

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        ready = [child for child in self._children.values() if child.ready]
        answers = await self._each(lambda client: client.signal_generate_cancel(request), ready)
        matched = any(isinstance(a, SignalGenerateCancelResponse) and a.matched for a in answers.values())
        return SignalGenerateCancelResponse(matched=matched)

    async def worker_capabilities(self, request: WorkerCapabilitiesRequest) -> WorkerCapabilitiesResponse:
        return merged_capabilities(await self._every(lambda client: client.worker_capabilities(request)))

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        self._config.applied(request)
        return merged_apply(await self._every_ready(lambda client: client.apply_model_config(request)))

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        self._config.replaced(request)
        return merged_replacement(await self._every_ready(lambda client: client.replace_model_configs(request)))

    async def drain(self, request: DrainRequest) -> DrainResponse:
        await self._each(lambda client: client.drain(request), self._children.values())
        return DrainResponse(acknowledged=True)

    def metric_sources(self) -> list[ChildSource]:
        """Each child found at the last probe round, as a source of its own series for `/metrics`."""
        return [
            ChildSource(child.name, child.device, functools.partial(_metrics_text, child.client))
            for child in self._children.values()
        ]

    # --- the placement control surface ---------------------------------------------------------------

    def snapshot(self) -> PlacementSnapshot:
        return self.placement.snapshot()

    def set_model(
        self,
        model_id: str,
        replicas: int | str | None = None,
        fill_mode: str | None = None,
        fill_factor: float | None = None,
    ) -> ModelOverride:
        return self.placement.set_model(model_id, replicas, fill_mode, fill_factor)

    def set_policy(self, knobs: Mapping[str, object]) -> PlacementPolicy:
        return self.placement.set_policy(knobs)

    async def repack(self, wait_s: float) -> RepackRecord | None:
        """Repack now; then wait up to `wait_s` for every wanted model to be loaded where it is now assigned."""
        record = self.placement.repack("manual")
        if record is None:
            return None
        self._warm()
        deadline = self.clock() + max(0.0, wait_s)
        while self._unwarmed() and self.clock() < deadline:
            await asyncio.sleep(_REPACK_POLL_S)  # bounded by `wait_s`; loads report through the warm-up tasks
            self._warm()
        return record

    # --- helpers --------------------------------------------------------------------------------------

    def _candidates(self, model_id: str) -> list[str]:
        """Ready children that have the model loaded, by name."""
        return [name for name, child in self._children.items() if child.ready and model_id in child.loaded]

    def _unwarmed(self) -> list[tuple[str, str]]:
        missing = []
        for model_id in self._wanted:
            for name in self.placement.assigned(model_id):
                child = self._children.get(name)
                if child is not None and child.ready and model_id not in child.loaded:
                    missing.append((name, model_id))
        return missing

    async def _ensure_on(self, child: ChildState, model_id: str) -> None:
        """Load one model on one child, polling until it is ready or settles otherwise."""
        request = EnsureModelReadyRequest(model_id=model_id)
        while True:
            try:
                async with asyncio.timeout(CONTROL_TIMEOUT_S):
                    answer = await child.client.ensure_model_ready(request)
            except Exception as exc:  # noqa: BLE001 - the next probe round tries again
                logger.warning("loading %s on %s failed to start: %s", model_id, child.name, exc)
                return
            if answer.state == MODEL_STATE_READY:
                child.loaded.add(model_id)
                return
            if answer.state not in _LOADING:
                return
            await asyncio.sleep(_REPACK_POLL_S)  # the load's pace

    async def _each(
        self, call: Callable[[WorkerClient], Awaitable[T]], children: Iterable[ChildState]
    ) -> dict[str, T | BaseException]:
        """`call` on each child at once, each bounded by CONTROL_TIMEOUT_S; failures are returned, not raised."""

        async def one(child: ChildState) -> T:
            async with asyncio.timeout(CONTROL_TIMEOUT_S):
                return await call(child.client)

        children = list(children)
        results = await asyncio.gather(*(one(child) for child in children), return_exceptions=True)
        return {child.name: result for child, result in zip(children, results, strict=True)}

    async def _every_ready(self, call: Callable[[WorkerClient], Awaitable[T]]) -> list[T]:
        """`call` on every ready child (one that joins later gets the config replayed first); all must answer."""
        return await self._every(call, [child for child in self._children.values() if child.ready])

    async def _every(
        self, call: Callable[[WorkerClient], Awaitable[T]], children: Sequence[ChildState] | None = None
    ) -> list[T]:
        """`call` on every child (or those given); all must answer (config and capabilities skip no child)."""
        children = list(self._children.values()) if children is None else children
        if not children:
            raise NoWorkerChild("no worker child is ready")
        answers = await self._each(call, children)
        failed = {name: answer for name, answer in answers.items() if isinstance(answer, BaseException)}
        if failed:
            name, error = next(iter(failed.items()))
            raise NoWorkerChild(f"worker child {name} did not answer: {error}") from error
        return [answer for answer in answers.values() if not isinstance(answer, BaseException)]


async def _metrics_text(client: WorkerChild) -> str:
    return (await client.worker_metrics(WorkerMetricsRequest())).text
