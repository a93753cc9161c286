"""The benchmarks' load generator (`scripts/bench/wrk.py`): wrk sends the given bodies in turn and what it counted
comes back parsed: answered requests, non-2xx answers, latencies. Against a small HTTP server on loopback that
records what it received."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from bench.wrk import run_wrk

from launcher import HOST


class _Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as wrk expects
    bodies: list[bytes] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append(body)
        answer = b'{"ok": true}'
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture()
def recorder() -> Iterator[tuple[str, type[_Recorder]]]:
    handler = type("Handler", (_Recorder,), {"bodies": [], "status": 200})
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_wrk_sends_the_bodies_in_turn_and_counts_the_answers(recorder: tuple[str, type[_Recorder]]) -> None:
    url, handler = recorder
    bodies = [json.dumps({"items": [{"text": f"sentence {i}"}]}).encode() for i in range(3)]
    stats = run_wrk(url, "/v1/encode/m", bodies, connections=2, seconds=1, items_per_request=4)
    assert stats.requests > 3 and stats.failures == 0
    assert stats.requests <= len(handler.bodies) <= stats.requests + 2  # those in flight when wrk stopped
    assert set(handler.bodies) == set(bodies)
    assert 0 < stats.p50_s <= stats.p95_s <= stats.p99_s < 1.0
    assert stats.items_per_second == pytest.approx(stats.requests * 4 / stats.duration_s)


def test_wrk_counts_error_statuses_as_failures(recorder: tuple[str, type[_Recorder]]) -> None:
    url, handler = recorder
    handler.status = 503
    stats = run_wrk(url, "/v1/encode/m", [b"{}"], connections=1, seconds=1, items_per_request=1)
    assert stats.requests > 0 and stats.status_errors == stats.requests
    assert stats.items_per_second == 0.0
