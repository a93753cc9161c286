"""The pool stream and lane consumer configurations, and what reconciling an existing stream changes."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from nats.js import api

from sie.settings import StreamSettings
from sie.transport.base import Lane
from sie.transport.nats.streams import MAX_ACK_PENDING, consumer_config, reconciled, stream_config


def test_the_pool_stream_is_created_as_seed_8_2_says() -> None:
    config = stream_config("default", StreamSettings(max_msgs=100_000, max_age_s=1800.0, storage="file", replicas=3))
    assert config.name == "WORK_POOL_default"
    assert config.subjects == ["sie.work.default.*.*.*"]
    assert config.retention == api.RetentionPolicy.WORK_QUEUE
    assert config.storage == api.StorageType.FILE
    assert (config.num_replicas, config.max_age, config.max_msgs) == (3, 1800.0, 100_000)
    assert config.discard == api.DiscardPolicy.NEW


def test_the_duplicate_window_fits_a_short_max_age() -> None:
    assert stream_config("p", StreamSettings(max_age_s=30.0)).duplicate_window == 30.0


def test_an_unknown_storage_names_the_setting() -> None:
    with pytest.raises(ValueError, match="SIE_STREAM_STORAGE"):
        stream_config("p", StreamSettings(storage="disk"))


def test_the_lane_consumer_is_durable_filtered_and_explicit() -> None:
    config = consumer_config(Lane("default", "l4", "sglang"), StreamSettings(ack_wait_s=30.0, max_deliver=20))
    assert config.name == config.durable_name == "default_l4_sglang"
    assert config.filter_subject == "sie.work.default.l4.sglang.*"
    assert config.ack_policy == api.AckPolicy.EXPLICIT
    assert (config.ack_wait, config.max_deliver, config.max_ack_pending) == (30.0, 20, MAX_ACK_PENDING)


def _as_the_server_reports(config: api.StreamConfig) -> api.StreamConfig:
    # A server answers with plain strings where we send enum members.
    return api.StreamConfig.from_response(config.as_dict())


def test_nothing_to_reconcile_when_the_stream_matches() -> None:
    wanted = stream_config("p", StreamSettings())
    assert reconciled(_as_the_server_reports(wanted), wanted) is None


def test_subjects_max_age_discard_and_replicas_are_reconciled() -> None:
    wanted = stream_config("p", StreamSettings(max_age_s=60.0, replicas=3))
    existing = dataclasses.replace(
        wanted, subjects=["sie.work.p.*.*.*", "sie.work.*.p"], max_age=3600.0, discard=api.DiscardPolicy.OLD,
        num_replicas=1, duplicate_window=120.0, max_msgs=5,
    )  # fmt: skip
    update = reconciled(_as_the_server_reports(existing), wanted)
    assert update is not None
    assert update.subjects == ["sie.work.p.*.*.*"]
    assert (update.max_age, update.discard, update.num_replicas) == (60.0, api.DiscardPolicy.NEW, 3)
    assert update.duplicate_window == 60.0  # JetStream refuses a window longer than max_age
    assert update.max_msgs == 5  # not one of the reconciled fields


def test_storage_is_never_reconciled_only_warned(caplog: pytest.LogCaptureFixture) -> None:
    wanted = stream_config("p", StreamSettings(storage="memory"))
    existing = _as_the_server_reports(dataclasses.replace(wanted, storage=api.StorageType.FILE))
    with caplog.at_level(logging.WARNING, logger="sie.transport.nats.streams"):
        assert reconciled(existing, wanted) is None
    assert "uses file storage but settings ask for memory" in caplog.text
