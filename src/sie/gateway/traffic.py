"""The gateway's recent inference traffic for the status page: a bounded ring of one-second buckets (requests,
failures, latency sum and maximum), fed by `TrafficWindow.observe`, an observer of the requests the gateway app
times (`sie.telemetry.requests.ObservedRequests`).

Recording is O(1) and allocation-free; nothing here exports metrics (telemetry/ does) or imports a web framework.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from sie.telemetry.requests import RequestRecord, Scope

# Five minutes of one-second buckets: what "the last minutes" on the status page shows.
WINDOW_S: Final = 300
# `requests_per_s` averages over this many whole seconds, long enough not to flicker at low rates.
RATE_SPAN_S: Final = 10
# The inference routes (seed 000 §14); probes, the status page and config reads are not traffic.
INFERENCE_PREFIXES: Final = ("/v1/encode/", "/v1/score/", "/v1/extract/")
EMBEDDINGS_PATH: Final = "/v1/embeddings"


@attrs.frozen
class TrafficSeries:
    """Per-second figures for the last whole seconds, oldest first; latencies in milliseconds, 0 where idle."""

    interval_s: int
    requests: list[int]
    failed: list[int]
    latency_mean_ms: list[float]
    latency_max_ms: list[float]

    def requests_per_s(self, span_s: int = RATE_SPAN_S) -> float:
        """The mean request rate over the newest `span_s` seconds."""
        recent = self.requests[-span_s:]
        return sum(recent) / len(recent) if recent else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "requests_per_s": round(self.requests_per_s(), 3),
            "requests": self.requests,
            "failed": self.failed,
            "latency_mean_ms": self.latency_mean_ms,
            "latency_max_ms": self.latency_max_ms,
        }


class TrafficWindow:
    """The ring: slot `second % seconds` holds that second's figures until the ring comes round to it again."""

    def __init__(self, seconds: int = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        if seconds < 1:
            raise ValueError(f"a traffic window holds at least one second, not {seconds}")
        self._seconds = seconds
        self._clock = clock
        self._stamp = [-1] * seconds  # which second each slot holds (-1: none yet)
        self._count = [0] * seconds
        self._failed = [0] * seconds
        self._latency_sum = [0.0] * seconds
        self._latency_max = [0.0] * seconds

    def record(self, latency_s: float, failed: bool) -> None:
        """Count one finished request that took `latency_s`; `failed` when it was answered with an error."""
        second = int(self._clock())
        slot = second % self._seconds
        if self._stamp[slot] != second:
            self._stamp[slot] = second
            self._count[slot] = self._failed[slot] = 0
            self._latency_sum[slot] = self._latency_max[slot] = 0.0
        self._count[slot] += 1
        self._failed[slot] += failed
        self._latency_sum[slot] += latency_s
        self._latency_max[slot] = max(self._latency_max[slot], latency_s)

    def observe(self, scope: Scope, record: RequestRecord, status: int, seconds: float) -> None:
        """Count an answered inference request (a `RequestObserver`); a status of 400 or more is a failure."""
        if is_inference_path(scope["path"]):
            self.record(seconds, status >= 400)

    def series(self) -> TrafficSeries:
        """The last `seconds` whole seconds (the current, partial one left out so the newest rate is not low)."""
        now = int(self._clock())
        requests, failed, mean_ms, max_ms = [], [], [], []
        for second in range(now - self._seconds, now):
            slot = second % self._seconds
            count = self._count[slot] if self._stamp[slot] == second else 0
            requests.append(count)
            failed.append(self._failed[slot] if count else 0)
            mean_ms.append(round(self._latency_sum[slot] / count * 1000, 3) if count else 0.0)
            max_ms.append(round(self._latency_max[slot] * 1000, 3) if count else 0.0)
        return TrafficSeries(1, requests, failed, mean_ms, max_ms)


def is_inference_path(path: str) -> bool:
    return path == EMBEDDINGS_PATH or path.startswith(INFERENCE_PREFIXES)
