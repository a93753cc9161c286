"""Readiness: every EnsureModelReady state mapped to its action — proceed, hold with progress ACKs
(one poller per model), MODEL_LOADING after the hold, MODEL_LOAD_FAILED / RESOURCE_EXHAUSTED replies,
NAK for a model this worker does not know."""

from __future__ import annotations

import attrs
import pytest

from sie.settings import BatchingSettings
from sie.sidecar.admission import Admission
from sie.sidecar.readiness import Clocks, Readiness, ReadinessOptions, ReadyModels, progress_interval
from sie.sidecar.settlement import Settler
from sie.sidecar.work import ReadyModel, Work
from sie.wire import codes
from sie.wire.ipc_control import EnsureModelReadyResponse, ModelDescriptor
from sie.wire.queue import WorkItem, WorkResult
from support.polling import eventually
from support.sidecar_fakes import RecordingDelivery as FakeDelivery


class FakeBus:
    def __init__(self) -> None:
        self.results: list[WorkResult] = []

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        self.results.append(result)

    async def flush(self) -> None:
        pass


class ScriptedWorker:
    """Answers EnsureModelReady from a script; the last answer repeats."""

    def __init__(self, *answers: EnsureModelReadyResponse | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def ensure_model_ready(self, request) -> EnsureModelReadyResponse:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


READY = EnsureModelReadyResponse(state="ready", batch_budget=16, descriptor=ModelDescriptor(max_batch_tokens=999))
LOADING = EnsureModelReadyResponse(state="loading_in_progress")
TIMINGS = ReadinessOptions(poll_s=0.005, progress_s=0.01, hold_s=10.0, nak_delay_s=5.0)


def works(log: list, count: int = 2) -> list[Work]:
    return [
        Work(FakeDelivery(WorkItem(
            work_item_id=f"r{i}.0", request_id=f"r{i}", item_index=0, total_items=1, operation="encode",
            model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
            reply_subject=f"_INBOX.gw.r{i}", timestamp=0.0,
        ), log), 0.0)
        for i in range(count)
    ]  # fmt: skip


class Proceeded(list):
    """The (ready model, works) groups readiness passed on to preparation."""

    async def put(self, group: tuple[ReadyModel, list[Work]]) -> None:
        self.append(group)


def build(worker: ScriptedWorker, timings: ReadinessOptions = TIMINGS, observe=None):
    bus = FakeBus()
    proceeded = Proceeded()
    models = ReadyModels(BatchingSettings(), observe)
    readiness = Readiness(worker, Settler(bus, Admission(100)), models, proceeded, timings)
    return readiness, bus, proceeded, models


def test_progress_interval_stays_below_ack_wait() -> None:
    assert progress_interval(ack_wait_s=30.0, nak_delay_s=5.0) == 5.0
    assert progress_interval(ack_wait_s=30.0, nak_delay_s=60.0) == 15.0  # clamped below ack-wait
    assert progress_interval(ack_wait_s=1.0, nak_delay_s=0.0) == 0.5


async def test_ready_proceeds_with_limits_and_is_cached() -> None:
    log: list = []
    worker = ScriptedWorker(READY)
    readiness, _, proceeded, models = build(worker)
    await readiness.admit("m", works(log))
    await readiness.admit("m", works(log))
    assert worker.calls == 1 and len(proceeded) == 2
    model = proceeded[0][0]
    assert (model.limits.max_cost, model.limits.max_items) == (999, 16)
    models.forget("m")  # the dispatcher's answer to a batch the worker could not run
    await readiness.admit("m", works(log))
    assert worker.calls == 2


async def test_loading_holds_with_progress_acks_then_proceeds() -> None:
    log: list = []
    worker = ScriptedWorker(
        EnsureModelReadyResponse(state="loading_started"), LOADING, LOADING, LOADING, LOADING, LOADING, READY
    )
    readiness, bus, proceeded, _ = build(worker)
    await readiness.admit("m", works(log, 1))
    await readiness.admit("m", works(log, 2))  # joins the hold: no second poller, no extra IPC call
    assert readiness.held() == 3 and worker.calls == 1
    await eventually(lambda: proceeded, timeout_s=2.0)
    assert sum(len(group) for _, group in proceeded) == 3
    assert any(entry[0] == "in_progress" for entry in log)
    assert not any(entry[0] in ("ack", "nak") for entry in log) and not bus.results
    assert worker.calls == 7 and readiness.held() == 0


async def test_a_hold_past_load_hold_s_answers_model_loading() -> None:
    log: list = []
    readiness, bus, proceeded, _ = build(ScriptedWorker(LOADING), ReadinessOptions(0.005, 0.01, 0.02, 5.0))
    await readiness.admit("m", works(log))
    await eventually(lambda: len(bus.results) == 2, timeout_s=2.0)
    assert {r.error_code for r in bus.results} == {codes.MODEL_LOADING}
    assert {r.retry_after_s for r in bus.results} == {5} and not any(r.success for r in bus.results)
    await eventually(lambda: ("ack", "r1.0") in log, timeout_s=2.0)
    assert not proceeded
    await readiness.close()


async def test_permanent_failure_answers_model_load_failed_with_metadata() -> None:
    log: list = []
    failed = EnsureModelReadyResponse(state="failed", error="no weights", error_class="NOT_FOUND", attempts=1)
    readiness, bus, _, _ = build(ScriptedWorker(failed))
    await readiness.admit("m", works(log))
    assert {r.error_code for r in bus.results} == {codes.MODEL_LOAD_FAILED}
    assert bus.results[0].error == "no weights"
    assert bus.results[0].result_msgpack.value == {"error_class": "NOT_FOUND", "attempts": 1, "permanent": True}
    assert ("ack", "r0.0") in log and ("ack", "r1.0") in log


async def test_load_failure_during_the_hold_is_answered() -> None:
    log: list = []
    failed = EnsureModelReadyResponse(state="failed", error="boom", error_class="UNKNOWN", attempts=2)
    readiness, bus, _, _ = build(ScriptedWorker(EnsureModelReadyResponse(state="loading_started"), LOADING, failed))
    await readiness.admit("m", works(log))
    await eventually(lambda: len(bus.results) == 2, timeout_s=2.0)
    assert bus.results[0].result_msgpack.value["attempts"] == 2


@pytest.mark.parametrize(("retry_after", "expected"), [(42.3, 43), (0.2, 1), (None, 1)])
async def test_oom_cooldown_answers_resource_exhausted(retry_after: float | None, expected: int) -> None:
    log: list = []
    oom = EnsureModelReadyResponse(state="retry_later", error="no memory", error_class="OOM", attempts=1,
                                   retry_after_s=retry_after)  # fmt: skip
    readiness, bus, _, _ = build(ScriptedWorker(oom))
    await readiness.admit("m", works(log, 1))
    assert bus.results[0].error_code == codes.RESOURCE_EXHAUSTED and bus.results[0].retry_after_s == expected
    assert log == [("ack", "r0.0")]


async def test_other_cooldown_answers_transient_model_load_failed() -> None:
    log: list = []
    network = EnsureModelReadyResponse(state="retry_later", error="down", error_class="NETWORK", attempts=3,
                                       retry_after_s=12.0)  # fmt: skip
    readiness, bus, _, _ = build(ScriptedWorker(network))
    await readiness.admit("m", works(log, 1))
    assert bus.results[0].error_code == codes.MODEL_LOAD_FAILED
    assert bus.results[0].result_msgpack.value == {"error_class": "NETWORK", "attempts": 3, "permanent": False}


async def test_a_model_unknown_to_this_worker_is_naked() -> None:
    log: list = []
    readiness, bus, _, _ = build(ScriptedWorker(EnsureModelReadyResponse(state="retry_later")))
    await readiness.admit("m", works(log, 1))
    assert log == [("nak", "r0.0", 5.0)] and not bus.results


async def test_an_ipc_failure_is_naked() -> None:
    log: list = []
    readiness, _, _, _ = build(ScriptedWorker(ConnectionError("socket closed")))
    await readiness.admit("m", works(log, 1))
    assert log == [("nak", "r0.0", 5.0)]


async def test_release_holds_gives_work_back_at_once() -> None:
    log: list = []
    readiness, _, proceeded, _ = build(ScriptedWorker(LOADING))
    await readiness.admit("m", works(log, 2))
    await readiness.release_holds()
    assert log == [("nak", "r0.0", 0.0), ("nak", "r1.0", 0.0)] and not proceeded


async def test_every_answer_is_told_to_the_observer() -> None:
    log: list = []
    heard: list[tuple[str, str]] = []
    failed = EnsureModelReadyResponse(state="failed", error="no weights", error_class="NOT_FOUND", attempts=1)
    readiness, _, _, _ = build(
        ScriptedWorker(failed), observe=lambda model_id, answer: heard.append((model_id, answer.state))
    )
    await readiness.admit("m", works(log, 1))
    assert heard == [("m", "failed")]


class HandClocks:
    """A monotonic and a wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.wall = 1_000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds


def with_deadline(batch: list[Work], deadline: float) -> list[Work]:
    for work in batch:
        work.item = work.delivery.item = attrs.evolve(work.item, deadline=deadline)
    return batch


def build_clocked(worker: ScriptedWorker, clocks: HandClocks, hold_s: float = 0.02):
    bus, proceeded = FakeBus(), Proceeded()
    options = ReadinessOptions(poll_s=0.005, progress_s=0.01, hold_s=hold_s, nak_delay_s=5.0)
    readiness = Readiness(worker, Settler(bus, Admission(100)), ReadyModels(BatchingSettings()), proceeded, options,
                          Clocks(lambda: clocks.now, lambda: clocks.wall))  # fmt: skip
    return readiness, bus, proceeded


async def test_work_with_a_deadline_is_held_past_load_hold_s_until_the_model_is_ready() -> None:
    log: list = []
    clocks = HandClocks()
    worker = ScriptedWorker(LOADING)
    readiness, bus, proceeded = build_clocked(worker, clocks, hold_s=0.02)
    await readiness.admit("m", with_deadline(works(log, 1), clocks.wall + 30.0))
    clocks.advance(20.0)  # far past SIE_SIDECAR_LOAD_HOLD_S, well before the deadline
    calls = worker.calls
    await eventually(lambda: worker.calls > calls + 2, timeout_s=2.0)
    assert not bus.results and readiness.held() == 1
    worker.answers = [READY]
    await eventually(lambda: proceeded, timeout_s=2.0)
    assert not bus.results and not any(entry[0] in ("ack", "nak") for entry in log)


async def test_held_work_is_answered_model_loading_just_before_its_deadline() -> None:
    log: list = []
    clocks = HandClocks()
    readiness, bus, proceeded = build_clocked(ScriptedWorker(LOADING), clocks, hold_s=60.0)
    await readiness.admit("m", with_deadline(works(log, 1), clocks.wall + 30.0))
    clocks.advance(29.5)  # within the answer margin of the deadline
    await eventually(lambda: bus.results, timeout_s=2.0)
    assert bus.results[0].error_code == codes.MODEL_LOADING and bus.results[0].retry_after_s == 5
    assert not proceeded
    await readiness.close()


async def test_retry_later_is_a_nak_with_the_workers_delay_while_the_deadline_allows() -> None:
    log: list = []
    clocks = HandClocks()
    oom = EnsureModelReadyResponse(state="retry_later", error="no memory", error_class="OOM", attempts=1,
                                   retry_after_s=8.0)  # fmt: skip
    readiness, bus, _ = build_clocked(ScriptedWorker(oom), clocks)
    roomy, tight = works(log, 2)
    with_deadline([roomy], clocks.wall + 30.0)
    with_deadline([tight], clocks.wall + 5.0)  # no time for another attempt after 8 s: answered now
    await readiness.admit("m", [roomy, tight])
    assert ("nak", "r0.0", 8.0) in log
    assert [result.request_id for result in bus.results] == ["r1"]
    assert bus.results[0].error_code == codes.RESOURCE_EXHAUSTED
