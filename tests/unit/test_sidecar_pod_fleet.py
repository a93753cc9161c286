"""The worker fleet: probe rounds feed placement, readiness is "any child ready", models load where placement
assigns them, batches go to a child that has the model and fail over when it fails, config goes to every
child, a hung probe recreates that child's connection, a generation streams from the child placement picks and its
cancel goes to every ready child. The children are fakes: the WorkerClient seam is the
subject here (tests/integration/test_fleet_children.py runs real ones)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import attrs
import pytest

from sie.placement.policy import PlacementPolicy
from sie.placement.router import Placement
from sie.sidecar.pod.children import LocalChildren
from sie.sidecar.pod.fleet import NoWorkerChild, WorkerFleet
from sie.wire import packb
from sie.wire.generate import GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc_batch import BatchOutcome, ItemOutcome, RunBatchItem, RunBatchRequest
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_READY,
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelControlEntry,
    ModelControlStatusRequest,
    ModelControlStatusResponse,
    PingRequest,
    PingResponse,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
    UnloadModelRequest,
    UnloadModelResponse,
)
from support.polling import eventually


class FakeChild:
    """A worker child: loads a model after `load_rounds` EnsureModelReady calls, runs batches, can fail."""

    def __init__(self, name: str, *, ready: bool = True, load_rounds: int = 0, hash_: str = "h1") -> None:
        self.name = name
        self.ready = ready
        self.load_rounds = load_rounds
        self.hash = hash_
        self.loaded: set[str] = set()
        self.ensure_calls: dict[str, int] = {}
        self.batches: list[RunBatchRequest] = []
        self.fail_batches: Exception | None = None
        self.give_back = False
        self.hang_probe = False
        self.drained = False
        self.generations: list[str] = []  # model ids of the generations started here
        self.fail_generate: Exception | None = None  # raised before the first event
        self.hold_generate: asyncio.Event | None = None  # awaited after the first event
        self.generate_closed = 0  # generations whose iterator ended before `done`
        self.cancels: list[str] = []
        self.running: set[str] = set()  # generation request ids running here
        self.unloads: list[str] = []
        self.keep: set[str] = set()  # models this child declines to unload (preloaded here)

    async def ping(self, request: PingRequest) -> PingResponse:
        return PingResponse(timestamp_ms=request.timestamp_ms, worker_id=self.name, ready=self.ready,
                            bundle_config_hash=self.hash, loaded_models=sorted(self.loaded))  # fmt: skip

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        calls = self.ensure_calls[request.model_id] = self.ensure_calls.get(request.model_id, 0) + 1
        if request.model_id == "broken":
            return EnsureModelReadyResponse(state=MODEL_STATE_FAILED, error="no weights", error_class="NOT_FOUND")
        if calls > self.load_rounds:
            self.loaded.add(request.model_id)
            return EnsureModelReadyResponse(state=MODEL_STATE_READY, batch_budget=32)
        return EnsureModelReadyResponse(state=MODEL_STATE_LOADING_IN_PROGRESS)

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        self.batches.append(request)
        if self.fail_batches is not None:
            raise self.fail_batches
        disposition = "nak_retry" if self.give_back else "publish_and_ack"
        return BatchOutcome(outcomes=[
            ItemOutcome(work_item_id=item.work_item_id, request_id=item.request_id, item_index=0,
                        disposition=disposition, inference_ms=2.0)
            for item in request.items
        ])  # fmt: skip

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        self.generations.append(request.model_id)
        if self.fail_generate is not None:
            raise self.fail_generate
        generation_id = request.work_item_msgpack.decode()
        self.running.add(generation_id)
        finished = False
        try:
            yield GenerateEvent(kind="publish", payload=packb({"child": self.name}))
            if self.hold_generate is not None:
                await self.hold_generate.wait()
            yield GenerateEvent(kind="ack")
            yield GenerateEvent(kind="done")
            finished = True
        finally:
            self.running.discard(generation_id)
            self.generate_closed += not finished

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        self.cancels.append(request.request_id)
        return SignalGenerateCancelResponse(matched=request.request_id in self.running)

    async def model_control_status(self, request: ModelControlStatusRequest) -> ModelControlStatusResponse:
        if self.hang_probe:
            await asyncio.Event().wait()
        models = [
            ModelControlEntry(model_id=model, state=MODEL_STATE_READY, max_batch_items=32) for model in self.loaded
        ]
        return ModelControlStatusResponse(worker_id=self.name, device="cpu", ready=self.ready, models=models)

    async def unload_model(self, request: UnloadModelRequest) -> UnloadModelResponse:
        self.unloads.append(request.model_id)
        if request.model_id in self.keep:
            return UnloadModelResponse(unloaded=False, reason="preloaded")
        self.loaded.discard(request.model_id)
        return UnloadModelResponse(unloaded=True, memory_freed_bytes=1000)

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        self.hash = request.bundle_config_hash
        return ApplyModelConfigResponse(applied=True, bundle_config_hash=self.hash)

    async def drain(self, request: DrainRequest) -> DrainResponse:
        self.drained = True
        return DrainResponse()


class RecordingChildren(LocalChildren):
    def __init__(self, children: dict[str, FakeChild]) -> None:
        super().__init__(children)
        self.reconnects: list[str] = []

    async def reconnect(self, name: str) -> None:
        self.reconnects.append(name)


def batch(model_id: str = "m", items: int = 2, batch_id: int = 1) -> RunBatchRequest:
    return RunBatchRequest(
        model_id=model_id, batch_id=batch_id, lora_key="", total_cost=items,
        items=[RunBatchItem(op="encode", work_item_id=f"w{batch_id}.{index}", request_id=f"w{batch_id}")
               for index in range(items)],
    )  # fmt: skip


def generation(model_id: str = "m", generation_id: str = "g1") -> ProcessGenerateRequest:
    # The fake children read the generation's id straight from the work item bytes.
    return ProcessGenerateRequest(model_id=model_id, work_item_msgpack=generation_id.encode())


def fleet_of(*children: FakeChild, policy: PlacementPolicy | None = None, probe_s: float = 60.0) -> WorkerFleet:
    directory = RecordingChildren({child.name: child for child in children})
    return WorkerFleet(directory, Placement(policy or PlacementPolicy()), probe_s)


async def test_ready_when_any_child_is_and_each_child_reports_its_device() -> None:
    async with fleet_of(FakeChild("worker-0", ready=False), FakeChild("worker-1")) as fleet:
        assert fleet.ready and fleet.size == 2
        children = {child.name: child for child in fleet.snapshot().children}
        assert children["worker-1"].ready and not children["worker-0"].ready
        ping = await fleet.ping(PingRequest(timestamp_ms=1.0))
        assert ping.ready and ping.bundle_config_hash == "h1"
    async with fleet_of(FakeChild("worker-0", ready=False)) as fleet:
        assert not fleet.ready
        assert not (await fleet.ping(PingRequest(timestamp_ms=1.0))).ready


async def test_round_robin_loads_everywhere_and_alternates_batches() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    async with fleet_of(first, second) as fleet:
        answer = await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))
        assert answer.state == MODEL_STATE_READY
        assert first.loaded == second.loaded == {"m"}
        assert fleet.replicas("m") == 2
        for batch_id in range(4):
            await fleet.run_batch(batch(batch_id=batch_id))
        assert len(first.batches) == len(second.batches) == 2


async def test_ready_as_soon_as_one_replica_is_and_the_other_warms_in_the_background() -> None:
    fast, slow = FakeChild("worker-0"), FakeChild("worker-1", load_rounds=2)
    async with fleet_of(fast, slow, probe_s=0.05) as fleet:
        assert (await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))).state == MODEL_STATE_READY
        assert fleet.replicas("m") == 1
        await eventually(lambda: fleet.replicas("m") == 2, timeout_s=5.0)
        assert slow.loaded == {"m"}


async def test_a_failed_child_hands_the_batch_to_another_replica() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    async with fleet_of(first, second) as fleet:
        await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))
        first.fail_batches = ConnectionResetError("worker-0 died")
        for batch_id in range(3):
            outcome = await fleet.run_batch(batch(batch_id=batch_id))
            assert all(item.disposition == "publish_and_ack" for item in outcome.outcomes)
        assert len(second.batches) == 3
        assert len(first.batches) == 1  # tried once, then no longer a candidate until it has the model again
        assert fleet.replicas("m") == 1


async def test_a_batch_given_back_whole_runs_on_another_replica() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    async with fleet_of(first, second) as fleet:
        await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))
        first.give_back = second.give_back = False
        first.give_back = True  # e.g. it evicted the model
        outcomes = [await fleet.run_batch(batch(batch_id=batch_id)) for batch_id in range(2)]
        assert all(item.disposition == "publish_and_ack" for outcome in outcomes for item in outcome.outcomes)
        second.give_back = True
        first.loaded.add("m")
        await fleet.probe()
        given_back = await fleet.run_batch(batch(batch_id=9))  # every replica gives it back: its answer stands
        assert all(item.disposition == "nak_retry" for item in given_back.outcomes)


async def test_no_replica_with_the_model_fails_the_batch_for_redelivery() -> None:
    async with fleet_of(FakeChild("worker-0")) as fleet:
        with pytest.raises(NoWorkerChild):
            await fleet.run_batch(batch("never-loaded"))
    async with fleet_of(FakeChild("worker-0", ready=False)) as fleet:
        with pytest.raises(NoWorkerChild):
            await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))


async def test_a_model_failing_on_every_child_is_failed_and_loading_wins_over_failed() -> None:
    async with fleet_of(FakeChild("worker-0"), FakeChild("worker-1")) as fleet:
        answer = await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="broken"))
        assert answer.state == MODEL_STATE_FAILED and answer.error_class == "NOT_FOUND"
    async with fleet_of(FakeChild("worker-0", load_rounds=5), FakeChild("worker-1")) as fleet:
        assert (await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))).state == MODEL_STATE_READY


async def test_lpt_packing_loads_a_single_replica_model_on_one_child_only() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    policy = PlacementPolicy(mode="lpt_packing")
    async with fleet_of(first, second, policy=policy) as fleet:
        assert (await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))).state == MODEL_STATE_READY
        hosts = [child for child in (first, second) if "m" in child.loaded]
        assert len(hosts) == 1
        for batch_id in range(4):
            await fleet.run_batch(batch(batch_id=batch_id))
        assert len(hosts[0].batches) == 4
        fleet.set_model("m", replicas=2)
        record = await fleet.repack(wait_s=5.0)
        assert record is not None and record.trigger == "manual"
        assert first.loaded == second.loaded == {"m"}  # the wait returned once the new replica was ready


async def shrink_to_one_replica(fleet: WorkerFleet, *children: FakeChild) -> FakeChild:
    """Place "m" on both children, then back on one by a repack: the child it left."""
    assert (await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))).state == MODEL_STATE_READY
    fleet.set_model("m", replicas=2)
    await fleet.repack(wait_s=5.0)
    assert all(child.loaded == {"m"} for child in children)
    fleet.set_model("m", replicas=1)
    await fleet.repack(wait_s=5.0)
    (kept,) = fleet.snapshot().models[0].replicas
    (left,) = [child for child in children if child.name != kept.child]
    return left


async def test_compaction_unloads_a_model_from_the_child_a_repack_took_it_off() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    async with fleet_of(first, second, policy=PlacementPolicy(mode="lpt_packing")) as fleet:
        left = await shrink_to_one_replica(fleet, first, second)
        await fleet.probe()  # the round after the repack finds the pair and unloads it
        await eventually(lambda: left.unloads == ["m"], timeout_s=5.0)
        assert "m" not in left.loaded and fleet.replicas("m") == 1
        compaction = fleet.snapshot().compaction
        assert compaction.unloads_total == 1 and compaction.freed_bytes_total == 1000
        await fleet.probe()
        assert not fleet.snapshot().compaction.pending and left.unloads == ["m"]  # done: nothing asked twice
        ran_there = len(left.batches)
        for batch_id in range(3):
            await fleet.run_batch(batch(batch_id=batch_id))
        assert len(left.batches) == ran_there  # batches go to the replica only


async def test_compaction_off_or_declined_leaves_the_model_loaded() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    policy = PlacementPolicy(mode="lpt_packing", compaction_mode="off")
    async with fleet_of(first, second, policy=policy) as fleet:
        left = await shrink_to_one_replica(fleet, first, second)
        await fleet.probe()
        assert left.unloads == [] and left.loaded == {"m"}
        assert fleet.snapshot().compaction.compactions_total == 0
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    first.keep = second.keep = {"m"}
    async with fleet_of(first, second, policy=PlacementPolicy(mode="lpt_packing")) as fleet:
        left = await shrink_to_one_replica(fleet, first, second)
        await fleet.probe()
        await eventually(lambda: left.unloads == ["m"], timeout_s=5.0)
        for _ in range(3):
            await fleet.probe()
        assert left.unloads == ["m"] and left.loaded == {"m"}  # asked once per compaction, not every round
        assert fleet.snapshot().compaction.unloads_total == 0


async def test_repack_outside_lpt_packing_is_none() -> None:
    async with fleet_of(FakeChild("worker-0")) as fleet:
        assert await fleet.repack(wait_s=0.0) is None


async def test_a_hung_probe_recreates_that_childs_connection() -> None:
    stuck, healthy = FakeChild("worker-0"), FakeChild("worker-1")
    directory = RecordingChildren({"worker-0": stuck, "worker-1": healthy})
    fleet = WorkerFleet(directory, Placement(PlacementPolicy()), probe_interval_s=0.05)
    async with fleet:
        stuck.hang_probe = True

        def stuck_is_unready() -> bool:
            return not {child.name: child for child in fleet.snapshot().children}["worker-0"].ready

        await eventually(lambda: "worker-0" in directory.reconnects and stuck_is_unready(), timeout_s=5.0)
        assert fleet.ready  # worker-1 still is


async def test_config_goes_to_every_child_and_a_split_hash_is_not_advertised() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    async with fleet_of(first, second) as fleet:
        request = ApplyModelConfigRequest(bundle_id="b", model_id="m", epoch=2, bundle_config_hash="h2",
                                          model_config="sie_id: m")  # fmt: skip
        applied = await fleet.apply_model_config(request)
        assert applied.applied and applied.bundle_config_hash == "h2" and first.hash == second.hash == "h2"
        second.hash = "h3"
        assert (await fleet.ping(PingRequest(timestamp_ms=1.0))).bundle_config_hash == ""
        await fleet.drain(DrainRequest())
        assert first.drained and second.drained


async def test_a_child_that_joins_later_gets_the_config_before_it_serves() -> None:
    first, late = FakeChild("worker-0"), FakeChild("worker-1", ready=False)
    async with fleet_of(first, late) as fleet:
        request = ApplyModelConfigRequest(bundle_id="b", model_id="m", epoch=2, bundle_config_hash="h2",
                                          model_config="sie_id: m")  # fmt: skip
        assert (await fleet.apply_model_config(request)).bundle_config_hash == "h2"
        assert late.hash == "h1"  # it was not ready: nothing was sent to it
        late.ready = True  # e.g. a restarted child with the baseline config
        await fleet.probe()
        assert late.hash == "h2"
        assert (await fleet.ping(PingRequest(timestamp_ms=1.0))).bundle_config_hash == "h2"


async def test_the_pods_gpu_count_is_the_sum_of_its_childrens() -> None:
    class GpuChild(FakeChild):
        async def ping(self, request: PingRequest) -> PingResponse:
            return attrs.evolve(await super().ping(request), device_count=1)

    async with fleet_of(GpuChild("worker-0"), GpuChild("worker-1"), FakeChild("worker-2")) as fleet:
        assert (await fleet.ping(PingRequest(timestamp_ms=1.0))).device_count == 2


async def test_a_generation_streams_from_the_child_placement_picks() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    second.loaded = {"m"}  # only worker-1 has the model
    async with fleet_of(first, second) as fleet:
        events = [event async for event in fleet.process_generate(generation())]
        assert [event.kind for event in events] == ["publish", "ack", "done"]
        assert events[0].payload == packb({"child": "worker-1"})
        assert (first.generations, second.generations) == ([], ["m"])
        await fleet.ensure_model_ready(EnsureModelReadyRequest(model_id="m"))  # now both have it: round robin
        for index in range(4):
            kinds = [event.kind async for event in fleet.process_generate(generation(generation_id=f"g{index}"))]
            assert kinds[-1] == "done"
        assert (len(first.generations), len(second.generations)) == (2, 3)
        assert all(child.inflight_batches == 0 for child in fleet.snapshot().children)


async def test_a_generation_holds_its_childs_placement_charge_until_it_ends() -> None:
    child = FakeChild("worker-0")
    child.loaded, child.hold_generate = {"m"}, asyncio.Event()
    async with fleet_of(child) as fleet:
        events = fleet.process_generate(generation())
        assert (await anext(events)).kind == "publish"
        assert [state.inflight_batches for state in fleet.snapshot().children] == [1]
        await events.aclose()  # the caller left early: the child's iterator is closed too
        assert child.generate_closed == 1 and child.running == set()
        assert [state.inflight_batches for state in fleet.snapshot().children] == [0]


async def test_a_child_failing_before_its_first_event_hands_the_generation_on() -> None:
    first, second = FakeChild("worker-0"), FakeChild("worker-1")
    first.loaded = second.loaded = {"m"}
    first.fail_generate = second.fail_generate = ConnectionResetError("gone")
    async with fleet_of(first, second) as fleet:
        second.fail_generate = None
        events = [event async for event in fleet.process_generate(generation())]
        assert events[0].payload == packb({"child": "worker-1"})
        assert len(first.generations) == len(second.generations) == 1 and fleet.replicas("m") == 1
        second.fail_generate = RuntimeError("decoder failed")  # the last replica fails too: its error surfaces
        with pytest.raises(RuntimeError, match="decoder failed"):
            await anext(fleet.process_generate(generation()))
        with pytest.raises(NoWorkerChild):  # no replica has the model now
            await anext(fleet.process_generate(generation()))


async def test_generate_cancel_asks_every_ready_child_and_matches_if_any_does() -> None:
    first, second, down = FakeChild("worker-0"), FakeChild("worker-1"), FakeChild("worker-2", ready=False)
    second.loaded, second.hold_generate = {"m"}, asyncio.Event()
    async with fleet_of(first, second, down) as fleet:
        events = fleet.process_generate(generation(generation_id="g7"))
        await anext(events)
        assert (await fleet.signal_generate_cancel(SignalGenerateCancelRequest(request_id="g7"))).matched
        assert not (await fleet.signal_generate_cancel(SignalGenerateCancelRequest(request_id="nobody"))).matched
        assert first.cancels == second.cancels == ["g7", "nobody"] and down.cancels == []
        await events.aclose()
