"""The pure parts of the DEAD_LETTERS stream (transport/nats/dead_letters.py): the model token of a letter's
subject, the deterministic Nats-Msg-Id replicas de-duplicate on, the stream's configuration, and a letter's
headers read back."""

from __future__ import annotations

import datetime

import pytest
from nats.js import api

from sie.catalog.names import dead_letter_subject, work_subject, work_worker_subject
from sie.settings import StreamSettings
from sie.transport.base import MaxDeliveriesAdvisory
from sie.transport.nats.dead_letters import (
    DEAD_LETTER_MAX_AGE_S,
    MSG_ID_HEADER,
    dead_letter_msg_id,
    dead_letter_stream_config,
    letter_from,
    letter_headers,
)
from sie.wire import to_msgpack
from sie.wire.queue import WorkItem

PUBLISHED = datetime.datetime(2026, 12, 1, 15, 23, 54, 128929, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        (work_subject("default", "l4", "default", "BAAI/bge-m3"), "sie.dlq.BAAI__bge-m3"),
        (work_subject("p", "rtx6000", "default", "vidore/colqwen2.5-v0.2"), "sie.dlq.vidore__colqwen2_dot_5-v0_dot_2"),
        (work_worker_subject("p", "l4", "default", "BAAI/bge-m3", "w-1"), "sie.dlq.BAAI__bge-m3"),
    ],
)
def test_the_model_token_is_the_sixth_subject_token(subject: str, expected: str) -> None:
    assert dead_letter_subject(subject) == expected


def test_the_msg_id_is_the_same_for_one_message_and_differs_for_a_reused_sequence() -> None:
    first = dead_letter_msg_id("WORK_POOL_default", 7, PUBLISHED)
    assert first == dead_letter_msg_id("WORK_POOL_default", 7, PUBLISHED) == "WORK_POOL_default.7.1796138634128929"
    assert dead_letter_msg_id("WORK_POOL_default", 7, PUBLISHED + datetime.timedelta(microseconds=1)) != first
    assert dead_letter_msg_id("WORK_POOL_other", 7, PUBLISHED) != first
    assert dead_letter_msg_id("WORK_POOL_default", 7, None) == "WORK_POOL_default.7"


def test_the_stream_keeps_letters_a_day_with_the_work_streams_storage_and_replicas() -> None:
    config = dead_letter_stream_config(StreamSettings(storage="file", replicas=3))
    assert (config.name, config.subjects) == ("DEAD_LETTERS", ["sie.dlq.>"])
    assert config.retention == api.RetentionPolicy.LIMITS
    assert (config.max_age, DEAD_LETTER_MAX_AGE_S) == (86400.0, 86400.0)
    assert (config.storage, config.num_replicas) == (api.StorageType.FILE, 3)
    assert dead_letter_stream_config(StreamSettings()).storage == api.StorageType.MEMORY


def test_a_letter_reads_back_what_its_headers_recorded() -> None:
    subject = work_subject("default", "l4", "default", "BAAI/bge-m3")
    item = WorkItem(
        work_item_id="r.0", request_id="r", item_index=0, total_items=1, operation="encode", model_id="BAAI/bge-m3",
        profile_id="default", pool_name="default", machine_profile="l4", router_id="gw", reply_subject="_INBOX.gw.r",
        timestamp=1.0, item={"text": "x"},
    )  # fmt: skip
    advisory = MaxDeliveriesAdvisory(
        stream="WORK_POOL_default", consumer="default_l4_default", stream_seq=7, deliveries=20,
        timestamp="2026-12-01T15:24:16.345950833Z",
    )  # fmt: skip
    headers = letter_headers(advisory, subject, PUBLISHED)
    assert headers[MSG_ID_HEADER] == dead_letter_msg_id("WORK_POOL_default", 7, PUBLISHED)
    stored = api.RawStreamMsg(subject="sie.dlq.BAAI__bge-m3", seq=3, data=to_msgpack(item), headers=headers)
    letter = letter_from(stored)
    assert (letter.letter_id, letter.subject, letter.item) == (3, subject, item)
    assert (letter.stream, letter.stream_seq) == ("WORK_POOL_default", 7)
    assert (letter.consumer, letter.deliveries) == ("default_l4_default", 20)
    assert (letter.dead_at, letter.published_at) == (advisory.timestamp, "2026-12-01T15:23:54.128929+00:00")

    foreign = letter_from(api.RawStreamMsg(subject="sie.dlq.x", seq=4, data=b"\xc1", headers=None))
    assert (foreign.letter_id, foreign.item, foreign.subject, foreign.deliveries) == (4, None, "", 0)
