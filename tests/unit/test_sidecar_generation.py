"""The generation stage: a scripted worker's events become chunks on the reply inbox and settlements of the delivery
in the order the worker says (publish, flush before ACK, NAK with its delay, progress ACKs); failures NAK before the
ACK and end the stream with an error chunk after it; `cancel.{router}.{request}` reaches a running stream and drops a
queued one; closing gives back or ends what runs; generate work is split off after readiness; a prompt the gateway
offloaded is read back from the payload store before the worker sees it, and a read that fails ends the stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs

from sie.sidecar.abandonment import Abandonment, Tombstones
from sie.sidecar.admission import Admission
from sie.sidecar.generation import GenerateSplit, Generations
from sie.sidecar.payloads import PayloadResolver
from sie.sidecar.settlement import Settler
from sie.sidecar.work import BatchLimits, ReadyModel, Work
from sie.stores.payload_store import PayloadStore
from sie.wire import codes
from sie.wire.generate import FINISH_CANCELLED, FINISH_ERROR, FINISH_STOP, GenerateChunk
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.offload import offloaded, packed_payload, payload_key
from sie.wire.queue import GenerateParams, WorkItem
from support.polling import eventually
from support.sidecar_fakes import (
    ACK,
    DONE,
    IN_PROGRESS,
    Fail,
    Publish,
    RecordingDelivery,
    ScriptedGenerateWorker,
    UntilCancelled,
    Wait,
    nak,
)

NAK_DELAY_S = 3.0


class FakeBus:
    """Records published chunks and flushes into the shared settlement log."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.chunks: list[tuple[str, GenerateChunk]] = []

    async def publish_result(self, subject: str, chunk: GenerateChunk) -> None:
        self.chunks.append((subject, chunk))
        self.log.append(("publish", chunk.seq))

    async def flush(self) -> None:
        self.log.append(("flush",))


def item(request_id: str = "r1", operation: str = "generate", generate: GenerateParams | None = None) -> WorkItem:
    return WorkItem(
        work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, total_items=1, operation=operation,
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject=f"_INBOX.gw.{request_id}", timestamp=0.0, generate=generate,
    )  # fmt: skip


class Stage:
    """The generation stage over real settlement, admission and abandonment, a recording bus and deliveries."""

    def __init__(self, script, store: PayloadStore | None = None) -> None:
        self.log: list = []
        self.bus = FakeBus(self.log)
        self.admission = Admission(100)
        self.abandonment = Abandonment(Tombstones(60.0))
        self.settler = Settler(self.bus, self.admission, self.abandonment)
        self.worker = ScriptedGenerateWorker(script)
        payloads = PayloadResolver(store, self.settler.live, self.settler.reply, "worker-test")
        self.generations = Generations(
            self.worker, self.settler, self.abandonment, "worker-test", NAK_DELAY_S, payloads
        )

    def start(self, request_id: str = "r1", work_item: WorkItem | None = None) -> Work:
        work = Work(RecordingDelivery(work_item or item(request_id), self.log), 0.0)
        admitted, _ = self.admission.admit("m", [work])
        assert admitted
        self.generations.start(work)
        return work

    async def ended(self) -> None:
        await eventually(lambda: self.generations.running == 0, timeout_s=5.0, what="the streams to end")
        assert self.admission.total == 0  # every slot was kept until its stream ended, then released

    def texts(self) -> list[str]:
        return [chunk.text_delta for _, chunk in self.bus.chunks]


async def test_chunks_reach_the_inbox_in_order_and_the_ack_follows_a_flush() -> None:
    gate = asyncio.Event()
    steps = [Publish("Hel"), ACK, Wait(gate), Publish("lo"), Publish("", done=True, finish_reason=FINISH_STOP), DONE]
    stage = Stage(lambda item, call: steps)
    work = stage.start()
    await eventually(lambda: ("ack", "r1.0") in stage.log, timeout_s=5.0, what="the ACK")
    # ACKed and still running: it keeps its slot (drain waits for it) but the keepalive has nothing to renew.
    assert stage.admission.total == 1 and work not in stage.admission.held()
    gate.set()
    await stage.ended()
    assert stage.log == [
        ("publish", 0), ("flush",), ("ack", "r1.0"), ("publish", 1), ("publish", 2), ("flush",),
    ]  # fmt: skip
    assert [subject for subject, _ in stage.bus.chunks] == ["_INBOX.gw.r1"] * 3
    assert stage.texts() == ["Hel", "lo", ""] and stage.bus.chunks[-1][1].done
    assert [call.request_id for call in stage.worker.calls] == ["r1"]


async def test_done_acks_a_stream_the_worker_never_acked_and_in_progress_renews_it() -> None:
    stage = Stage(lambda item, call: [IN_PROGRESS, Publish("hi", done=True, finish_reason=FINISH_STOP), DONE])
    stage.start()
    await stage.ended()
    assert stage.log == [("in_progress", "r1.0"), ("publish", 0), ("flush",), ("ack", "r1.0")]


async def test_a_nak_event_naks_with_its_delay_and_nothing_acks_it_after() -> None:
    stage = Stage(lambda item, call: [nak(250), DONE])
    stage.start()
    await stage.ended()
    assert stage.log == [("nak", "r1.0", 0.25), ("flush",)]


async def test_an_ipc_failure_before_the_ack_naks_for_redelivery() -> None:
    stage = Stage(lambda item, call: [Publish("a"), Fail()])
    stage.start()
    await stage.ended()
    assert ("nak", "r1.0", NAK_DELAY_S) in stage.log
    assert not any(entry[0] == "ack" for entry in stage.log)
    assert stage.worker.cancels == ["r1"]  # told to stop, in case the worker still decodes it


async def test_an_ipc_failure_after_the_ack_ends_the_stream_with_an_error_chunk() -> None:
    stage = Stage(lambda item, call: [Publish("a"), ACK, Publish("b"), Fail()])
    stage.start()
    await stage.ended()
    assert not any(entry[0] == "nak" for entry in stage.log)
    assert stage.log[-2:] == [("publish", 2), ("flush",)]
    first, terminal = stage.bus.chunks[0][1], stage.bus.chunks[-1][1]
    assert terminal.seq == 2 and terminal.attempt_id == first.attempt_id == "r1.0/1"
    assert terminal.done and terminal.finish_reason == FINISH_ERROR
    assert terminal.error_code == codes.INFERENCE_ERROR and terminal.error and terminal.worker_id == "worker-test"
    assert (terminal.request_id, terminal.work_item_id) == ("r1", "r1.0")


async def test_events_ending_without_done_before_the_ack_nak() -> None:
    stage = Stage(lambda item, call: [Publish("a")])
    stage.start()
    await stage.ended()
    assert stage.log[-1] == ("nak", "r1.0", NAK_DELAY_S)


async def test_the_event_reply_subject_wins_and_an_unsafe_one_fails_the_stream() -> None:
    stage = Stage(lambda item, call: [Publish("a", reply_subject="_INBOX.gw.other"), ACK, DONE])
    stage.start()
    await stage.ended()
    assert stage.bus.chunks[0][0] == "_INBOX.gw.other"
    unsafe = Stage(lambda item, call: [Publish("a", reply_subject="sie.work.>"), ACK, DONE])
    unsafe.start()
    await unsafe.ended()
    assert not unsafe.bus.chunks and unsafe.log == [("nak", "r1.0", NAK_DELAY_S)]


async def test_a_cancel_reaches_the_running_stream_on_the_worker() -> None:
    stage = Stage(lambda item, call: [
        Publish("a"), ACK, UntilCancelled(), Publish("", done=True, finish_reason=FINISH_CANCELLED), DONE,
    ])  # fmt: skip
    stage.start("r1")
    stage.start("r2")
    await eventually(lambda: ("ack", "r2.0") in stage.log and ("ack", "r1.0") in stage.log, timeout_s=5.0)
    await stage.generations.on_cancel("cancel.gw.r1", {})
    await eventually(lambda: stage.generations.running == 1, timeout_s=5.0, what="r1 to end")
    assert stage.worker.cancels == ["r1"]
    assert stage.bus.chunks[-1][1].finish_reason == FINISH_CANCELLED and stage.bus.chunks[-1][1].request_id == "r1"
    await stage.generations.on_cancel("cancel.other-router.r2", {})  # another gateway's r2: not this stream
    await stage.generations.on_cancel("work_cancel.gw.r2", {})  # not a generation cancel
    assert stage.worker.cancels == ["r1"]
    await stage.generations.close()


async def test_a_cancelled_generation_still_queued_is_ack_dropped_before_the_worker() -> None:
    stage = Stage(lambda item, call: [Publish("a"), ACK, DONE])
    await stage.generations.on_cancel("cancel.gw.r1", {})
    stage.start("r1")
    await stage.ended()
    assert stage.log == [("ack", "r1.0")] and not stage.worker.calls and not stage.worker.cancels
    assert stage.abandonment.dropped["cancelled"] == 1


def test_generation_and_work_cancels_each_drop_only_their_own_kind() -> None:
    abandonment = Abandonment(Tombstones(60.0))
    abandonment.cancel_generation("cancel.gw.r1")
    abandonment.tombstones.add("gw", "r2")  # work_cancel.gw.r2
    generate_1, encode_1 = (
        Work(RecordingDelivery(item("r1"), []), 0.0),
        Work(RecordingDelivery(item("r1", "encode"), []), 0.0),
    )
    generate_2, encode_2 = (
        Work(RecordingDelivery(item("r2"), []), 0.0),
        Work(RecordingDelivery(item("r2", "encode"), []), 0.0),
    )
    assert abandonment.reason(generate_1) == "cancelled" and abandonment.reason(encode_1) is None
    assert abandonment.reason(encode_2) == "cancelled" and abandonment.reason(generate_2) is None
    assert abandonment.cancel_generation("cancel.gw") is None


async def test_closing_gives_back_an_unacked_stream_and_ends_an_acked_one() -> None:
    stage = Stage(
        lambda item, call: [Publish("a"), ACK, UntilCancelled()] if item.request_id == "r1" else [Wait(asyncio.Event())]
    )
    stage.start("r1")
    stage.start("r2")
    await eventually(lambda: ("ack", "r1.0") in stage.log and len(stage.worker.calls) == 2, timeout_s=5.0)
    await stage.generations.close()
    assert stage.generations.running == 0 and stage.admission.total == 0
    assert ("nak", "r2.0", 0.0) in stage.log  # not acked: given back at once
    assert sorted(stage.worker.cancels) == ["r1", "r2"]
    terminal = stage.bus.chunks[-1][1]
    assert terminal.request_id == "r1" and terminal.seq == 1 and terminal.finish_reason == FINISH_ERROR


async def test_closing_before_a_stream_began_gives_its_work_back() -> None:
    stage = Stage(lambda item, call: [DONE])
    stage.start("r1")
    await stage.generations.close()  # the task never ran a step
    assert stage.log == [("nak", "r1.0", 0.0)] and stage.admission.total == 0 and not stage.worker.calls


async def test_the_split_sends_generate_work_to_generations_and_the_rest_on() -> None:
    stage = Stage(lambda item, call: [Publish("a", done=True), DONE])
    passed: list = []

    class Rest:
        async def put(self, group) -> None:
            passed.append(group)

    split = GenerateSplit(stage.generations, Rest())
    works = [
        Work(RecordingDelivery(item("e1", "encode"), stage.log), 0.0),
        Work(RecordingDelivery(item("g1"), stage.log), 0.0),
    ]
    stage.admission.admit("m", works)
    model = ReadyModel("m", ModelDescriptor(), BatchLimits(max_cost=64, max_items=8))
    await split.put((model, works))
    await eventually(lambda: ("ack", "g1.0") in stage.log, timeout_s=5.0)
    assert [work.item.request_id for _, group in passed for work in group] == ["e1"]
    assert [call.request_id for call in stage.worker.calls] == ["g1"]
    only_generate = Work(RecordingDelivery(item("g2"), stage.log), 0.0)
    stage.admission.admit("m", [only_generate])
    await split.put((model, [only_generate]))  # nothing left for preparation: nothing passed on
    assert len(passed) == 1
    await stage.generations.close()


CHAT = GenerateParams(messages=[{"role": "user", "content": "a long question " * 50}], max_new_tokens=3, seed=7)


async def test_an_offloaded_prompt_is_read_back_before_the_worker_generates(tmp_path: Path) -> None:
    store = PayloadStore(str(tmp_path / "payloads"))
    original = item("r1", generate=CHAT)
    await store.put(payload_key(original), packed_payload(original))
    sent = offloaded(original, payload_key(original))
    assert sent.payload_ref == "r1_0.bin" and sent.generate == attrs.evolve(CHAT, messages=None)
    stage = Stage(lambda item, call: [Publish("ok", done=True, finish_reason=FINISH_STOP), DONE], store)
    stage.start(work_item=sent)
    await stage.ended()
    (generated,) = stage.worker.calls
    assert generated.generate == CHAT and generated.payload_ref is None  # prompt and settings whole again
    assert stage.texts() == ["ok"] and stage.log[-1] == ("ack", "r1.0")


async def test_an_offloaded_prompt_that_cannot_be_read_ends_the_stream_and_is_acked(tmp_path: Path) -> None:
    """Gone from the store (or no store at all): the gateway hears why at once; a retry would fail the same way."""
    sent = offloaded(item("r1", generate=CHAT), "r1_0.bin")
    for store, reason in ((PayloadStore(str(tmp_path / "empty")), "gone from the payload store"),
                          (None, "no SIE_PAYLOAD_STORE_URL")):  # fmt: skip
        stage = Stage(lambda item, call: [Publish("never"), DONE], store)
        stage.start(work_item=sent)
        await stage.ended()
        assert stage.worker.calls == []
        ((_, terminal),) = stage.bus.chunks
        assert terminal.done and terminal.finish_reason == FINISH_ERROR and terminal.seq == 0
        assert terminal.error_code == codes.INTERNAL_ERROR and reason in (terminal.error or "")
        assert stage.log == [("publish", 0), ("flush",), ("flush",), ("ack", "r1.0")]
