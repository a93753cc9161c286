"""A stand-in for a gateway's `GET /v1/pools` on loopback (seed 000 §16.3), for the tests whose subject is the
sidecar's polling of it: the pool table is the test's to change at will (a reassignment, a lease gone), and
`fail_with` makes every answer an error status, as an overloaded gateway would. `requests` records each request's
method, path and Authorization header.

Its pools are rendered by `sie.pools.Pool.to_json`, the gateway's own code, so their shape cannot drift from the
real answers. The pools API itself (writes, renewals, refusals) is tested against a real gateway:
tests/integration/test_cli_pools.py and tests/e2e/test_pools*.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sie.pools import AssignedWorker, Pool, PoolSpec

POOLS_PATH = "/v1/pools"
TTL_S = 300.0


def pool_json(
    name: str,
    *,
    queue_pool: str = "default",
    gpus: dict[str, int] | None = None,
    gpu_caps: dict[str, int] | None = None,
    assigned: Sequence[str] = (),
    protected: bool = False,
) -> dict[str, Any]:
    """One pool as a gateway answers it, leased now for TTL_S (never expiring when `protected`); `assigned` names
    its workers (machine profile l4, bundle default, one GPU each)."""
    now = time.time()
    ttl_s = None if protected else TTL_S
    spec = PoolSpec(name=name, queue_pool=queue_pool, gpus=gpus or {}, gpu_caps=gpu_caps or {}, ttl_seconds=ttl_s)
    workers = [AssignedWorker(name=worker, machine_profile="l4", bundle="default", gpus=1) for worker in assigned]
    pool = Pool(spec=spec, created_at=now, last_renewed=now, expires_at=None if ttl_s is None else now + ttl_s,
                assigned_workers=workers, protected=protected)  # fmt: skip
    return pool.to_json(now)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"detail": {"code": code, "message": message}}


class PoolsGateway:
    """The stand-in server; `url` is its base URL, `pools` its table (name → Pool JSON), shared with the test."""

    def __init__(self) -> None:
        self.pools: dict[str, dict[str, Any]] = {"default": pool_json("default", protected=True)}
        self.fail_with: int | None = None
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def put(self, pool: dict[str, Any]) -> None:
        """Add or replace a pool (Pool JSON, e.g. from `pool_json`), as a gateway would on a write or reassignment."""
        with self._lock:
            self.pools[pool["spec"]["name"]] = pool

    def remove(self, name: str) -> None:
        """Forget a pool, as when its lease expired."""
        with self._lock:
            self.pools.pop(name, None)

    def answer(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        """The status and JSON document of one request."""
        if self.fail_with is not None:
            return self.fail_with, _error("UNAVAILABLE", "the stand-in fails on purpose")
        if (method, path) != ("GET", POOLS_PATH):
            return 404, _error("NOT_FOUND", f"the stand-in answers GET {POOLS_PATH} only, not {method} {path}")
        with self._lock:
            return 200, {"pools": list(self.pools.values())}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gateway.requests.append((self.command, self.path, self.headers.get("Authorization")))
                status, document = gateway.answer(self.command, self.path)
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                """Quiet: the tests read `requests` instead."""

        return Handler

    @contextmanager
    def running(self) -> Iterator[PoolsGateway]:
        thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="pools-gateway", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join()
