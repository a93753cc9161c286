"""Gateway auth on real servers (seed 000 §13): a token-mode `sie run --role all` that the public sie-sdk, our SDK
and the OpenAI client reach with their api_key (and are refused without it), its admin and operational routes,
tokens rotated through SIE_AUTH_TOKENS_FILE while it serves, and `sie run --role gateway` enforcing the same
rules. Marked slow: real server processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import RoleProcess, free_port, serving_all
from sie.client import SIEClient
from support.polling import holds_within

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]
ENV_TOKEN, FILE_TOKEN, ROTATED_TOKEN, ADMIN = "infer-env", "infer-file", "infer-rotated", "admin-secret"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(f"# mounted secret\n{FILE_TOKEN}\n")
    return path


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory, tokens_file: Path) -> Iterator[str]:
    """A token-mode all-in-one server: inference tokens from SIE_AUTH_TOKENS and a tokens file, an admin token."""
    env = {
        "SIE_AUTH_MODE": "token",
        "SIE_AUTH_TOKENS": ENV_TOKEN,
        "SIE_AUTH_TOKENS_FILE": str(tokens_file),
        "SIE_ADMIN_TOKEN": ADMIN,
    }
    with serving_all(tmp_path_factory.mktemp("auth-server") / "server.log", ["--preload", MINILM], env) as url:
        yield url


def test_the_public_sdk_sends_its_api_key(token_server: str, public_sdk) -> None:
    client = public_sdk.SIEClient(token_server, api_key=ENV_TOKEN)
    try:
        result = client.encode(MINILM, {"text": "Hello world"})
        assert np.allclose(np.asarray(result["dense"])[:4], HELLO_WORLD_PREFIX, atol=1e-5)
    finally:
        client.close()
    for api_key in (None, "wrong"):
        refused = public_sdk.SIEClient(token_server, api_key=api_key)
        try:
            with pytest.raises(public_sdk.RequestError) as caught:
                refused.encode(MINILM, {"text": "Hello world"})
            assert (caught.value.status_code, caught.value.code) == (401, "UNAUTHORIZED")
        finally:
            refused.close()


def test_our_sdk_sends_its_api_key(token_server: str) -> None:
    with SIEClient(token_server, api_key=FILE_TOKEN) as client:
        result = client.encode(MINILM, {"text": "Hello world"})
        assert np.allclose(result["dense"][:4], HELLO_WORLD_PREFIX, atol=1e-5)


def test_the_openai_client_sends_its_api_key(token_server: str) -> None:
    from openai import AuthenticationError, OpenAI

    with OpenAI(base_url=f"{token_server}/v1", api_key=ENV_TOKEN, max_retries=0) as client:
        response = client.embeddings.create(model=MINILM, input=["Hello world"])
        assert np.allclose(response.data[0].embedding[:4], HELLO_WORLD_PREFIX, atol=1e-5)
        with OpenAI(base_url=f"{token_server}/v1", api_key="wrong", max_retries=0) as wrong:
            with pytest.raises(AuthenticationError) as caught:
                wrong.embeddings.create(model=MINILM, input=["Hello world"])
            assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"


def test_probes_operational_and_admin_routes(token_server: str) -> None:
    with httpx.Client(base_url=token_server, timeout=10) as http:
        assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
        for path in ("/metrics", "/health", "/v1/models", "/v1/placement"):
            refused = http.get(path)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer", path
            assert http.get(path, headers=bearer(ENV_TOKEN)).status_code == 200, path
        change: dict[str, object] = {}  # changes no knob: the answer is the policy in force
        forbidden = http.post("/v1/placement/policy", json=change, headers=bearer(ENV_TOKEN))
        assert forbidden.status_code == 403 and forbidden.json()["detail"]["code"] == "FORBIDDEN"
        assert http.post("/v1/placement/policy", json=change, headers=bearer(ADMIN)).status_code == 200
        assert http.get("/v1/dlq", headers=bearer(FILE_TOKEN)).status_code == 403
        assert http.get("/v1/dlq", headers=bearer(ADMIN)).status_code == 200


def test_a_rotated_tokens_file_takes_effect_without_a_restart(token_server: str, tokens_file: Path) -> None:
    replacement = tokens_file.with_name("tokens.new")
    replacement.write_text(f"{ROTATED_TOKEN}\n")
    replacement.replace(tokens_file)

    def rotated() -> bool:
        new = httpx.get(f"{token_server}/v1/models", headers=bearer(ROTATED_TOKEN), timeout=10).status_code
        old = httpx.get(f"{token_server}/v1/models", headers=bearer(FILE_TOKEN), timeout=10).status_code
        return (new, old) == (200, 401)

    assert holds_within(rotated, 20.0, interval_s=0.2), "the rotated token never took effect"
    assert httpx.get(f"{token_server}/v1/models", headers=bearer(ENV_TOKEN), timeout=10).status_code == 200


def test_the_gateway_role_enforces_the_same_rules(tmp_path: Path) -> None:
    """`--role gateway` (NATS unreachable: it still serves its read routes) with the operational routes exempt."""
    port = free_port()
    env = {
        "SIE_AUTH_MODE": "token",
        "SIE_AUTH_TOKEN": ENV_TOKEN,
        "SIE_AUTH_EXEMPT_OPERATIONAL": "true",
        "SIE_NATS_URL": f"nats://127.0.0.1:{free_port()}",
    }
    server = RoleProcess("gateway", ["--host", "127.0.0.1", "--port", str(port)], env, tmp_path / "gateway.log")
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_http_ready(f"{base}/healthz")
        with httpx.Client(base_url=base, timeout=10) as http:
            assert http.get("/health").status_code == 200  # exempt
            refused = http.get("/v1/models")
            assert refused.status_code == 401 and refused.json()["detail"]["code"] == "UNAUTHORIZED"
            assert http.get("/v1/models", headers=bearer(ENV_TOKEN)).status_code == 200
            closed = http.get("/v1/dlq", headers=bearer(ENV_TOKEN))  # no SIE_ADMIN_TOKEN: admin routes closed
            assert closed.status_code == 403 and "SIE_ADMIN_TOKEN is not set" in closed.json()["detail"]["message"]
    finally:
        code = server.stop()
    assert code == 0, server.log()
