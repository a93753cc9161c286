"""Settlement rules (seed 001 "Request Flow"): verdicts on subjects, NAK delays of outcomes, and the
publish → flush → ACK order, with a failed publish or flush leaving the message unsettled."""

from __future__ import annotations

import pytest

from sie.sidecar.admission import Admission
from sie.sidecar.settlement import (
    Settler,
    Verdict,
    is_safe_reply_subject,
    outcome_nak_delay,
    verdict,
)
from sie.sidecar.work import Work
from sie.transport.base import TransportUnavailable
from sie.wire.ipc_batch import ItemOutcome
from sie.wire.queue import WorkItem, WorkResult
from support.sidecar_fakes import RecordingDelivery as FakeDelivery

WORK_SUBJECT = "sie.work.default.default.default.sentence-transformers__all-MiniLM-L6-v2"


class Log(list):
    """Every publish, flush and settlement, in order."""


class FakeBus:
    def __init__(self, log: Log, fail_subjects: frozenset[str] = frozenset(), fail_flush: bool = False) -> None:
        self._log = log
        self._fail_subjects = fail_subjects
        self._fail_flush = fail_flush

    async def publish_result(self, subject: str, result: WorkResult) -> None:
        if subject in self._fail_subjects:
            raise TransportUnavailable("broken")
        self._log.append(("publish", result.work_item_id))

    async def flush(self) -> None:
        if self._fail_flush:
            raise TransportUnavailable("broken")
        self._log.append(("flush",))


def item(index: int, reply: str | None = None) -> WorkItem:
    return WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation="encode",
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject=reply or f"_INBOX.gw.r{index}", timestamp=0.0,
    )  # fmt: skip


def admitted(log: Log, admission: Admission, count: int) -> list[Work]:
    works = [Work(FakeDelivery(item(i), log, WORK_SUBJECT), 0.0) for i in range(count)]
    admission.admit("m", works)
    return works


def result(work: Work) -> WorkResult:
    return WorkResult(work_item_id=work.item.work_item_id, request_id=work.item.request_id, item_index=0, success=True)


# --- verdicts -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "safe"),
    [
        ("_INBOX.gw-1.0190f-7a", True),
        ("_INBOX.", False),
        ("_INBOX.gw.>", False),
        ("_INBOX.gw.*", False),
        ("_INBOX.gw..x", False),
        ("_INBOX.gw x", False),
        ("sie.work.default.x", False),
        ("inbox.gw.1", False),
        ("", False),
    ],
)
def test_reply_subject_safety(reply: str, safe: bool) -> None:
    assert is_safe_reply_subject(reply) is safe


@pytest.mark.parametrize(
    ("subject", "reply", "expected"),
    [
        (WORK_SUBJECT, "_INBOX.gw.1", Verdict.ACCEPT),
        (WORK_SUBJECT, "evil.subject", Verdict.ACK_DROP),
        ("sie.work.default.default.default", "_INBOX.gw.1", Verdict.NAK),
        ("sie.work.default.default.default.m.worker-1", "_INBOX.gw.1", Verdict.ACCEPT),  # worker direct-dispatch
        ("sie.work.default.default.default.m.worker-1.x", "_INBOX.gw.1", Verdict.NAK),
        ("sie.work.default.default.default.m.", "_INBOX.gw.1", Verdict.NAK),
        ("sie.work.default..default.m", "_INBOX.gw.1", Verdict.NAK),
        ("other.work.default.default.default.m", "_INBOX.gw.1", Verdict.NAK),
        ("sie.work.default.default", "nope", Verdict.ACK_DROP),  # unsafe reply wins: nobody to answer
    ],
)
def test_verdicts(subject: str, reply: str, expected: Verdict) -> None:
    assert verdict(subject, reply) is expected


def test_outcome_nak_delays() -> None:
    def outcome(disposition: str, delay_ms: int = 0) -> ItemOutcome:
        return ItemOutcome(work_item_id="a", request_id="r", item_index=0, disposition=disposition,
                           nak_delay_ms=delay_ms)  # fmt: skip

    assert outcome_nak_delay(outcome("publish_and_ack")) is None
    assert outcome_nak_delay(outcome("publish_error_and_ack")) is None
    assert outcome_nak_delay(outcome("nak_retry", 5000)) == 5.0
    assert outcome_nak_delay(outcome("something_new")) == 0.0


# --- the settler ----------------------------------------------------------------------------------


async def test_results_are_published_and_flushed_before_any_ack() -> None:
    log, admission = Log(), Admission(10)
    works = admitted(log, admission, 3)
    await Settler(FakeBus(log), admission).reply([(w, result(w)) for w in works])
    assert log == [
        ("publish", "r0.0"), ("publish", "r1.0"), ("publish", "r2.0"), ("flush",),
        ("ack", "r0.0"), ("ack", "r1.0"), ("ack", "r2.0"),
    ]  # fmt: skip
    assert admission.total == 0


async def test_a_failed_publish_leaves_that_message_unsettled() -> None:
    log, admission = Log(), Admission(10)
    works = admitted(log, admission, 3)
    bus = FakeBus(log, fail_subjects=frozenset({works[1].item.reply_subject}))
    await Settler(bus, admission).reply([(w, result(w)) for w in works])
    assert ("ack", "r1.0") not in log and not any(entry[0] == "nak" for entry in log)
    assert ("ack", "r0.0") in log and ("ack", "r2.0") in log
    assert admission.total == 0  # no longer ours: redelivery after ack-wait brings it back


async def test_a_failed_flush_leaves_every_message_unsettled() -> None:
    log, admission = Log(), Admission(10)
    works = admitted(log, admission, 2)
    await Settler(FakeBus(log, fail_flush=True), admission).reply([(w, result(w)) for w in works])
    assert [entry[0] for entry in log] == ["publish", "publish"]


async def test_nak_ack_drop_and_progress() -> None:
    log, admission = Log(), Admission(10)
    works = admitted(log, admission, 3)
    settler = Settler(FakeBus(log), admission)
    await settler.in_progress(works[:1], now=5.0)
    await settler.nak(works[:2], 2.5)
    await settler.ack_drop(works[2:])
    assert log == [("in_progress", "r0.0"), ("nak", "r0.0", 2.5), ("nak", "r1.0", 2.5), ("ack", "r2.0")]
    assert works[0].progressed == 5.0 and admission.total == 0


async def test_a_settle_error_does_not_stop_the_others() -> None:
    log, admission = Log(), Admission(10)
    works = admitted(log, admission, 2)

    async def broken() -> None:
        raise TransportUnavailable("gone")

    works[0].delivery.ack = broken
    await Settler(FakeBus(log), admission).ack_drop(works)
    assert log == [("ack", "r1.0")]
