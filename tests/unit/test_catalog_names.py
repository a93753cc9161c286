"""Subject, stream and consumer names (contracts Part A §2.2, seed 000 §8.2)."""

from __future__ import annotations

import pytest

from sie.catalog import names


def test_work_subject_has_six_tokens_for_dotted_ids() -> None:
    subject = names.work_subject("default", "rtx6000", "default", "vidore/colqwen2.5-v0.2")
    assert subject == "sie.work.default.rtx6000.default.vidore__colqwen2_dot_5-v0_dot_2"
    assert len(subject.split(".")) == 6


def test_pool_token_is_not_normalised() -> None:
    assert names.work_subject("gpu-a", "l4", "default", "BAAI/bge-m3") == "sie.work.gpu-a.l4.default.BAAI__bge-m3"


def test_lane_names() -> None:
    assert names.lane_filter_subject("default", "l4", "default") == "sie.work.default.l4.default.*"
    assert names.work_pool_stream_name("default") == "WORK_POOL_default"
    assert names.work_pool_stream_subjects("default") == ["sie.work.default.*.*.*"]
    assert names.work_consumer_name("default", "l4.x", "default") == "default_l4_dot_x_default"


def test_worker_names() -> None:
    subject = names.work_worker_subject("default", "l4", "default", "BAAI/bge-m3", "pod.1")
    assert subject == "sie.work.default.l4.default.BAAI__bge-m3.pod_dot_1"
    assert names.work_worker_stream_name("pod.1") == "WORK_WORKER_pod_dot_1"
    assert names.work_worker_consumer_name("w") == "gen-w"
    with pytest.raises(ValueError, match="empty"):
        names.work_worker_stream_name("  ")
    assert names.is_work_worker_subject(subject)
    assert names.dead_letter_subject(subject) == "sie.dlq.BAAI__bge-m3"  # the model token, not the worker
    for other in ("sie.work.default.l4.default.BAAI__bge-m3", f"{subject}.x", "sie.work.default.l4.default.m.", "a.b"):
        assert not names.is_work_worker_subject(other), other


def test_reply_config_health_and_dlq() -> None:
    assert names.reply_subject("gw-1", "abc-123") == "_INBOX.gw-1.abc-123"
    assert names.inbox_wildcard("gw-1") == "_INBOX.gw-1.>"
    assert names.config_subject("default") == "sie.config.models.default"
    assert names.CONFIG_ALL_SUBJECT == "sie.config.models._all"
    assert names.health_subject("worker-1") == "sie.health.worker-1"
    assert names.work_cancel_subject("gw-1", "r1") == "work_cancel.gw-1.r1"
    assert names.dead_letter_subject("sie.work.default.default.default.BAAI__bge-m3") == "sie.dlq.BAAI__bge-m3"


def test_the_pool_of_a_work_subject() -> None:
    assert names.work_subject_pool("sie.work.gpu-a.l4.default.BAAI__bge-m3") == "gpu-a"
    for other in ("sie.work", "sie.work.", "sie.work..l4", "sie.workers.p", "sie.health.w", "_INBOX.gw.r"):
        assert names.work_subject_pool(other) is None, other
