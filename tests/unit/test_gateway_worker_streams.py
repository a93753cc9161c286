"""The sweep of gone workers' direct-dispatch streams: which streams are stale (no live worker, empty, idle for longer
than max_age), what one sweep deletes and counts, and that it waits while the live workers are not all known. The
broker's side is tests/integration/test_worker_stream_sweep.py, the registry's live workers
tests/unit/test_gateway_registry.py."""

from __future__ import annotations

from collections.abc import Collection

import attrs

from sie.gateway.worker_streams import WorkerStreamSweep, stale_worker_streams
from sie.telemetry.gateway import WorkerStreamMetrics
from sie.telemetry.metrics import Telemetry
from sie.transport.base import WorkerStream
from sie.transport.loopback import LoopbackTransport

NOW = 10_000.0
MAX_AGE_S = 1800.0
SWEPT_SERIES = "sie_gateway_worker_streams_swept_total"


def _stream(
    worker: str, *, idle_s: float = MAX_AGE_S + 1, messages: int = 0, max_age_s: float = MAX_AGE_S
) -> WorkerStream:
    return WorkerStream(
        name=f"WORK_WORKER_{worker}", messages=messages, max_age_s=max_age_s, active_at=NOW - idle_s, last_seq=3,
        created="2026-12-01T00:00:00Z",
    )  # fmt: skip


def _stale(streams: list[WorkerStream], live: Collection[str] = frozenset()) -> list[str]:
    return [stream.name for stream in stale_worker_streams(streams, live, MAX_AGE_S, NOW)]


def test_an_empty_stream_of_no_live_worker_idle_past_max_age_is_stale() -> None:
    assert _stale([_stream("gone")]) == ["WORK_WORKER_gone"]


def test_a_live_workers_stream_is_kept_its_id_normalised_as_the_stream_name() -> None:
    assert _stale([_stream("pod_dot_1"), _stream("gone")], {"pod.1", " "}) == ["WORK_WORKER_gone"]


def test_a_stream_holding_messages_is_kept() -> None:
    assert _stale([_stream("gone", messages=1)]) == []


def test_a_stream_idle_for_max_age_or_less_is_kept() -> None:
    assert _stale([_stream("a", idle_s=MAX_AGE_S), _stream("b", idle_s=5.0)]) == []


def test_the_longer_of_the_streams_own_max_age_and_the_setting_counts() -> None:
    longer = _stream("longer", idle_s=MAX_AGE_S + 10, max_age_s=MAX_AGE_S + 60)
    shorter = _stream("shorter", idle_s=MAX_AGE_S + 10, max_age_s=60.0)
    unlimited = _stream("unlimited", idle_s=MAX_AGE_S + 10, max_age_s=0.0)
    assert _stale([longer, shorter, unlimited]) == ["WORK_WORKER_shorter", "WORK_WORKER_unlimited"]


def test_a_stream_whose_times_could_not_be_read_is_never_stale() -> None:
    assert _stale([attrs.evolve(_stream("gone"), active_at=float("inf"))]) == []


class FakeStreams:
    """WorkerStreams whose `delete_worker_stream` answers False for the names in `taken` (another gateway's)."""

    def __init__(self, streams: list[WorkerStream], taken: frozenset[str] = frozenset()) -> None:
        self.streams = list(streams)
        self.taken = taken
        self.deleted: list[str] = []

    async def worker_streams(self) -> list[WorkerStream]:
        return list(self.streams)

    async def delete_worker_stream(self, stream: WorkerStream) -> bool:
        self.streams.remove(stream)
        if stream.name in self.taken:
            return False
        self.deleted.append(stream.name)
        return True


def _swept_total(telemetry: Telemetry) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = telemetry.prometheus_text().decode()
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    return sum(sample.value for sample in samples if sample.name == SWEPT_SERIES)


async def test_a_sweep_deletes_the_stale_streams_and_counts_those_it_deleted() -> None:
    streams = FakeStreams([_stream("gone"), _stream("other"), _stream("live"), _stream("young", idle_s=1.0)],
                          taken=frozenset({"WORK_WORKER_other"}))  # fmt: skip
    telemetry = Telemetry()
    metrics = WorkerStreamMetrics(telemetry)
    assert _swept_total(telemetry) == 0  # declared from the start
    sweep = WorkerStreamSweep(streams, lambda: {"live"}, MAX_AGE_S, clock=lambda: NOW, metrics=metrics)
    assert [stream.name for stream in await sweep.sweep()] == ["WORK_WORKER_gone"]
    assert streams.deleted == ["WORK_WORKER_gone"]  # the other gateway swept "other" first: not counted here
    assert (sweep.swept, _swept_total(telemetry)) == (1, 1)
    assert await sweep.sweep() == []
    assert [stream.name for stream in streams.streams] == ["WORK_WORKER_live", "WORK_WORKER_young"]


async def test_no_stream_is_swept_while_the_live_workers_are_not_all_known() -> None:
    streams = FakeStreams([_stream("gone")])
    sweep = WorkerStreamSweep(streams, lambda: None, MAX_AGE_S, clock=lambda: NOW)
    assert await sweep.sweep() == []
    assert streams.deleted == []


async def test_in_process_there_are_no_worker_streams_to_sweep() -> None:
    async with LoopbackTransport() as transport:
        assert await transport.worker_streams() == []
        assert await transport.delete_worker_stream(_stream("gone")) is False
