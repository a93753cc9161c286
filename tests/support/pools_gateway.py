"""A stand-in for a gateway's pools API on loopback (seed 000 §16.3; the shared contract's `/v1/pools` routes): it
answers `GET /v1/pools`, `POST /v1/pools`, `GET|DELETE /v1/pools/{name}` and `POST /v1/pools/{name}/renew` with the
Pool JSON shape from an in-memory table, so the sidecar's pool gate and `sie pools` can be driven over real HTTP.
It checks only what those clients rely on (409 on a live name, 404, 403 for protected pools, 400 without `gpus`);
`fail_with` makes every answer an error status, as an overloaded gateway would; `requests` records each request's
method, path and Authorization header.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

POOLS_PATH = "/v1/pools"
NOW = "2026-01-01T00:00:00Z"


def pool_json(
    name: str,
    *,
    queue_pool: str = "default",
    gpus: dict[str, int] | None = None,
    gpu_caps: dict[str, int] | None = None,
    assigned: Sequence[str] = (),
    protected: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    """One pool in the contract's JSON shape; `assigned` names its workers (machine profile l4, one GPU each)."""
    workers = [
        {"name": worker, "url": "", "gpu": "l4", "machine_profile": "l4", "bundle": "default", "gpus": 1}
        for worker in assigned
    ]
    return {
        "spec": {
            "name": name, "bundle": spec.get("bundle"), "gpus": gpus or {}, "gpu_caps": gpu_caps or {},
            "queue_pool": queue_pool, "ttl_seconds": None if protected else spec.get("ttl_seconds", 300.0),
            "minimum_worker_count": spec.get("minimum_worker_count", 0),
            "pinned_models": spec.get("pinned_models", []),
        },
        "status": {
            "state": "active" if protected or workers else "pending", "assigned_workers": workers,
            "created_at": NOW, "last_renewed": NOW, "expires_at": None if protected else NOW,
        },
        "protected": protected,
    }  # fmt: skip


def _error(code: str, message: str) -> dict[str, Any]:
    return {"detail": {"code": code, "message": message}}


class PoolsGateway:
    """The stand-in server; `url` is its base URL, `pools` its table (name → Pool JSON), shared with the test."""

    def __init__(self) -> None:
        self.pools: dict[str, dict[str, Any]] = {"default": pool_json("default", protected=True)}
        self.fail_with: int | None = None
        self.requests: list[tuple[str, str, str | None]] = []
        self.renewals = 0
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

    def answer(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        """The status and JSON document of one request."""
        if self.fail_with is not None:
            return self.fail_with, _error("UNAVAILABLE", "the stand-in fails on purpose")
        parts = path.removeprefix(POOLS_PATH).strip("/").split("/") if path.startswith(POOLS_PATH) else None
        with self._lock:
            if parts == [""]:
                return self._collection(method, body or {})
            if parts and parts[0] and len(parts) <= 2:
                return self._member(method, parts)
        return 404, _error("NOT_FOUND", f"no route {method} {path}")

    def _collection(self, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "GET":
            return 200, {"pools": list(self.pools.values())}
        name = str(body.get("name", "")).lower()
        if not name or not body.get("gpus"):
            return 400, _error("INVALID_POOL", "a pool needs a name and at least one gpus entry")
        if name in self.pools:
            return 409, _error("POOL_EXISTS", f"pool {name!r} already exists")
        spec = {key: value for key, value in body.items() if key != "name"}
        self.pools[name] = pool_json(name, **spec)
        return 201, self.pools[name]

    def _member(self, method: str, parts: list[str]) -> tuple[int, dict[str, Any]]:
        name = parts[0].lower()
        pool = self.pools.get(name)
        if pool is None:
            return 404, _error("POOL_NOT_FOUND", f"pool {name!r} not found")
        if parts[1:] == ["renew"] and method == "POST":
            self.renewals += 1
            pool["status"]["last_renewed"] = pool["status"]["expires_at"] = datetime.now(UTC).isoformat()
            return 200, pool
        if method == "DELETE":
            if pool["protected"]:
                return 403, _error("POOL_PROTECTED", f"pool {name!r} is protected")
            del self.pools[name]
            return 200, {"deleted": name}
        return 200, pool

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                gateway.requests.append((self.command, self.path, self.headers.get("Authorization")))
                status, document = gateway.answer(self.command, self.path, body)
                payload = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _serve

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
