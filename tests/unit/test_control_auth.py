"""The config service's auth matrix (contracts Part A §2.4), through HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sie.control.auth import AccessPolicy, bearer_token
from sie.control.http.app import build_control_app
from sie.control.loading import load_registry
from sie.control.writes import ConfigWriter
from sie.stores.config_store import MemoryConfigStore

REPO = Path(__file__).resolve().parents[2]
BODY = (
    "sie_id: acme/m\nhf_id: acme/m\nprofiles:\n"
    "  default:\n    adapter_path: sie.adapters.dense:D\n    max_batch_tokens: 8\n"
)
FULL = AccessPolicy(admin_token="admin", read_tokens=["reader"], auth_tokens=["infer"])


def client(policy: AccessPolicy) -> httpx.AsyncClient:
    registry = load_registry(REPO / "config/bundles", REPO / "config/models")
    app = build_control_app(ConfigWriter(registry, MemoryConfigStore()), registry, policy)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://config")


async def call(policy: AccessPolicy, method: str, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": token} if token is not None else {}
    async with client(policy) as http:
        content = BODY if method == "POST" else None
        return await http.request(method, path, headers=headers, content=content)


@pytest.mark.parametrize(
    ("method", "path", "token", "status", "detail"),
    [
        ("GET", "/v1/configs/models", None, 401, "Missing Authorization header"),
        ("GET", "/v1/configs/models", "Bearer nope", 403, "Invalid token"),
        ("GET", "/v1/configs/models", "Bearer infer", 200, None),
        ("GET", "/v1/configs/models", "reader", 200, None),
        ("GET", "/v1/configs/models", "Bearer admin", 200, None),
        ("GET", "/v1/configs/export", "Bearer infer", 403, "Invalid token"),
        ("GET", "/v1/configs/export", "Bearer reader", 200, None),
        ("GET", "/v1/configs/export", "admin", 200, None),
        ("POST", "/v1/configs/models", None, 401, "Missing Authorization header"),
        ("POST", "/v1/configs/models", "Bearer infer", 403, "Admin token required for config mutations"),
        ("POST", "/v1/configs/models", "Bearer reader", 403, "Admin token required for config mutations"),
        ("POST", "/v1/configs/models", "Bearer nope", 403, "Invalid token"),
        ("POST", "/v1/configs/models", "Bearer admin", 201, None),
        ("GET", "/healthz", None, 200, None),
        ("GET", "/readyz", None, 200, None),
    ],
)
async def test_matrix(method: str, path: str, token: str | None, status: int, detail: str | None) -> None:
    response = await call(FULL, method, path, token)
    assert response.status_code == status
    if detail is not None:
        assert response.json() == {"detail": detail}


async def test_only_inference_token_refuses_writes() -> None:
    policy = AccessPolicy(auth_tokens=["infer"])
    response = await call(policy, "POST", "/v1/configs/models", "Bearer infer")
    assert response.status_code == 403
    assert response.json() == {"detail": "Write operations require SIE_ADMIN_TOKEN (read tokens are not sufficient)."}
    assert (await call(policy, "GET", "/v1/configs/models", "Bearer infer")).status_code == 200


async def test_no_tokens_is_open_except_in_production() -> None:
    assert (await call(AccessPolicy(), "POST", "/v1/configs/models", None)).status_code == 201
    assert (await call(AccessPolicy(production=True), "GET", "/v1/configs/models", None)).status_code == 403


def test_bearer_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("abc") == "abc"
    assert bearer_token("  ") is None and bearer_token(None) is None
