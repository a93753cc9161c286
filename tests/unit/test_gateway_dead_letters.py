"""The gateway's dead-letter pure parts: the work item a replay sends and how a letter is shown (binary values by
size). The admin-token rule of `/v1/dlq` is gateway auth's (tests/integration/test_gateway_auth.py)."""

from __future__ import annotations

from sie.gateway.dead_letters import replay_item
from sie.gateway.http.dead_letters import letter_document, letter_summary
from sie.transport.base import DeadLetter
from sie.wire.queue import WorkItem

ITEM = WorkItem(
    work_item_id="gw-1-7.2", request_id="gw-1-7", item_index=2, total_items=3, operation="encode", model_id="org/m",
    profile_id="default", pool_name="default", machine_profile="l4", router_id="gw-1",
    reply_subject="_INBOX.gw-1.gw-1-7", timestamp=100.0, deadline=130.0, item={"text": "x", "images": [b"\x00" * 5]},
)  # fmt: skip
SUBJECT = "sie.work.default.l4.default.org__m"


def _letter(item: WorkItem | None) -> DeadLetter:
    return DeadLetter(
        letter_id=4, subject=SUBJECT, stream="WORK_POOL_default", stream_seq=9, consumer="default_l4_default",
        deliveries=20, dead_at="2026-12-01T00:00:00+00:00", published_at="2026-11-30T23:59:00+00:00", item=item,
    )  # fmt: skip


def test_a_replay_gets_a_fresh_request_id_reply_subject_and_deadline() -> None:
    sent = replay_item(ITEM, 4, now=500.0, timeout_s=60.0)
    assert (sent.request_id, sent.work_item_id) == ("gw-1-7-dlq4", "gw-1-7-dlq4.2")
    assert sent.reply_subject == "_INBOX.gw-1.gw-1-7-dlq4"
    assert (sent.timestamp, sent.deadline) == (500.0, 560.0)
    assert (sent.item, sent.model_id, sent.item_index, sent.router_id) == (ITEM.item, "org/m", 2, "gw-1")


def test_a_letter_is_shown_with_its_item_and_binary_values_by_size() -> None:
    document = letter_document(_letter(ITEM))
    assert document["item"]["item"] == {"text": "x", "images": [{"binary_bytes": 5}]}
    assert (document["id"], document["model"], document["request_id"]) == (4, "org/m", "gw-1-7")
    assert document["replayable"]
    assert document["dead_letter_subject"] == "sie.dlq.org__m"
    summary = letter_summary(_letter(None))
    assert (summary["model"], summary["request_id"], summary["replayable"]) == (None, None, False)
    assert letter_document(_letter(None))["item"] is None
