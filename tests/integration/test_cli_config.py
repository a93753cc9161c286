"""`sie config …` through the CLI against a real `sie run --role config` process with a local store.

Exit codes (issue 6 item 5): 0 ok, 1 refused by the service (error printed), 2 usage or connection problem.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from launcher import RoleProcess, free_port
from sie.catalog import dump_yaml, load_yaml
from sie.cli.main import app

REPO = Path(__file__).resolve().parents[2]
MINILM = REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml"
TOKEN = "secret"
runner = CliRunner()


class ConfigService:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        env = {"SIE_CONFIG_STORE_DIR": str(root / "store"), "SIE_ADMIN_TOKEN": TOKEN}
        self.process = RoleProcess("config", ["--host", "127.0.0.1", "--port", port], env,
                                   root / "config.log")  # fmt: skip
        self.process.wait_http_ready(f"{self.url}/readyz")

    def model_file(self, model_id: str, *, drop_profiles: tuple[str, ...] = (), name: str | None = None) -> Path:
        """The MiniLM YAML under a new sie_id (optionally without some profiles)."""
        document = load_yaml(MINILM.read_text())
        document["sie_id"] = model_id
        for profile in drop_profiles:
            del document["profiles"][profile]
        path = self.root / (name or f"{model_id.replace('/', '__')}.yaml")
        path.write_text(dump_yaml(document))
        return path


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfigService]:
    running = ConfigService(tmp_path_factory.mktemp("cli-config"))
    try:
        yield running
    finally:
        running.process.stop()


@pytest.fixture
def env(service: ConfigService, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """URL and token from the environment, as an operator would set them."""
    for name in ("SIE_CONFIG_SERVICE_URL", "SIE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return {"SIE_CONFIG_SERVICE_URL": service.url, "SIE_ADMIN_TOKEN": TOKEN}


def sie_config(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["config", *args], env=env or {})


def as_json(result: Result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def epoch_of(env: dict[str, str]) -> int:
    return as_json(sie_config("epoch", env=env))["epoch"]


def test_apply_creates_profiles_and_bumps_the_epoch(service: ConfigService, env: dict[str, str]) -> None:
    before = epoch_of(env)
    body = as_json(sie_config("apply", str(service.model_file("acme/cli-apply")), env=env))
    assert body["model_id"] == "acme/cli-apply"
    assert sorted(body["created_profiles"]) == ["default", "int8", "multivector"]
    assert epoch_of(env) == before + 1
    again = as_json(sie_config("apply", str(service.model_file("acme/cli-apply")), env=env))
    assert again["created_profiles"] == [] and sorted(again["existing_profiles_skipped"]) == [
        "default", "int8", "multivector"]  # fmt: skip
    assert epoch_of(env) == before + 1


def test_apply_with_idempotency_key_replays_the_same_body(service: ConfigService, env: dict[str, str]) -> None:
    path = service.model_file("acme/cli-idem")
    first = as_json(sie_config("apply", str(path), "--idempotency-key", "cli-k1", env=env))
    assert first["created_profiles"]
    epoch = epoch_of(env)
    replay = as_json(sie_config("apply", str(path), "--idempotency-key", "cli-k1", env=env))
    assert replay == first
    assert epoch_of(env) == epoch
    other = service.model_file("acme/cli-idem-other")
    mismatch = sie_config("apply", str(other), "--idempotency-key", "cli-k1", env=env)
    assert mismatch.exit_code == 1 and "422" in mismatch.stderr and "idempotency_mismatch" in mismatch.stderr


def test_apply_refused_by_the_service_exits_1(service: ConfigService, env: dict[str, str]) -> None:
    broken = service.root / "broken.yaml"
    broken.write_text("sie_id: acme/broken\nprofiles: [unterminated\n")
    result = sie_config("apply", str(broken), env=env)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: 400 ") and result.stdout == ""
    invalid = service.root / "invalid.yaml"
    invalid.write_text("sie_id: acme/invalid\nprofiles:\n  default:\n    max_batch_tokens: -1\n")
    result = sie_config("apply", str(invalid), env=env)
    assert result.exit_code == 1 and result.stderr.startswith("error: 4")


def test_wrong_token_is_refused(service: ConfigService, env: dict[str, str]) -> None:
    path = service.model_file("acme/cli-denied")
    result = sie_config("apply", str(path), "--token", "wrong", env=env)
    assert result.exit_code == 1 and result.stderr.startswith("error: 403 ")
    result = sie_config("apply", str(path), env={**env, "SIE_ADMIN_TOKEN": "wrong"})
    assert result.exit_code == 1 and "403" in result.stderr
    missing = sie_config("get", "acme/cli-denied", env=env)
    assert missing.exit_code == 1 and "404" in missing.stderr  # never written


def test_flags_override_the_environment(service: ConfigService, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SIE_CONFIG_SERVICE_URL", "SIE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    result = sie_config("epoch", "--url", service.url + "/", "--token", TOKEN)
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(result.stdout)["epoch"], int)


def test_no_url_is_a_usage_error(service: ConfigService, env: dict[str, str]) -> None:
    result = sie_config("list", env={"SIE_ADMIN_TOKEN": TOKEN})
    assert result.exit_code == 2 and "no config service URL" in result.stderr
    result = sie_config("apply", str(service.model_file("acme/cli-nourl")), env={"SIE_ADMIN_TOKEN": TOKEN})
    assert result.exit_code == 2


def test_unreachable_url_is_a_usage_error(env: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = sie_config("epoch", env={**env, "SIE_CONFIG_SERVICE_URL": dead})
    assert result.exit_code == 2 and f"cannot reach {dead}" in result.stderr


def test_missing_file_or_argument_is_a_usage_error(service: ConfigService, env: dict[str, str]) -> None:
    assert sie_config("apply", str(service.root / "nope.yaml"), env=env).exit_code == 2
    assert sie_config("get", env=env).exit_code == 2
    assert sie_config("status", "acme/x", env=env).exit_code == 2  # --gateway is required


def test_list_get_and_bundles(service: ConfigService, env: dict[str, str]) -> None:
    as_json(sie_config("apply", str(service.model_file("acme/cli-read")), env=env))
    listed = sie_config("list", env=env)
    assert listed.exit_code == 0, listed.output
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in listed.stdout.splitlines()}
    assert rows["acme/cli-read"] == ["default,int8,multivector", "api"]
    assert rows["sentence-transformers/all-MiniLM-L6-v2"][1] == "filesystem"
    document = json.loads(sie_config("list", "--json", env=env).stdout)  # the raw document for scripts
    assert {model["model_id"] for model in document["models"]} == set(rows)
    got = sie_config("get", "acme/cli-read", env=env)
    assert got.exit_code == 0, got.output
    document = load_yaml(got.stdout)
    assert document["sie_id"] == "acme/cli-read"
    assert sorted(document["profiles"]) == ["default", "int8", "multivector"]
    bundles = as_json(sie_config("bundles", env=env))
    assert "default" in json.dumps(bundles)


def test_replace_then_delete_then_get_is_404(service: ConfigService, env: dict[str, str]) -> None:
    as_json(sie_config("apply", str(service.model_file("acme/cli-cycle")), env=env))
    smaller = service.model_file("acme/cli-cycle", drop_profiles=("int8",), name="cycle-smaller.yaml")
    replaced = as_json(sie_config("replace", "acme/cli-cycle", str(smaller), env=env))
    assert replaced["replaced"] is True and replaced["model_id"] == "acme/cli-cycle"
    listed = sie_config("list", env=env).stdout
    assert "acme/cli-cycle\tdefault,multivector\tapi" in listed.splitlines()
    epoch = epoch_of(env)
    deleted = as_json(sie_config("delete", "acme/cli-cycle", env=env))
    assert deleted["deleted"] is True and deleted["epoch"] == epoch + 1
    gone = sie_config("get", "acme/cli-cycle", env=env)
    assert gone.exit_code == 1 and gone.stderr.startswith("error: 404 ")
    again = as_json(sie_config("delete", "acme/cli-cycle", env=env))  # idempotent: nothing left to delete
    assert again["deleted"] is False and again["unchanged"] is True and epoch_of(env) == epoch + 1


def test_store_keeps_api_models_as_files(service: ConfigService, env: dict[str, str]) -> None:
    as_json(sie_config("apply", str(service.model_file("acme/cli-stored")), env=env))
    stored = service.root / "store" / "models" / "acme__cli-stored.yaml"
    assert load_yaml(stored.read_text())["sie_id"] == "acme/cli-stored"


def test_status_against_a_gateway_that_is_not_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIE_ADMIN_TOKEN", raising=False)
    gateway = f"http://127.0.0.1:{free_port()}"
    result = sie_config("status", "acme/x", "--gateway", gateway)
    assert result.exit_code == 1
    assert f"{gateway}: unreachable" in result.stdout


def test_status_wait_gives_up_after_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIE_ADMIN_TOKEN", raising=False)
    gateways = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    started = time.monotonic()
    result = sie_config("status", "acme/x", "--gateway", gateways[0], "--gateway", gateways[1],
                        "--wait", "--timeout", "1")  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.exit_code == 1
    assert elapsed < 3.0, elapsed
    assert [line.split(": ")[0] for line in result.stdout.splitlines()] == gateways


def test_status_sends_the_admin_token_from_the_environment(service: ConfigService, env: dict[str, str]) -> None:
    """The config service guards reads: a sent token gets 400 (`/status` is the gateway's route), none gets 401."""
    model = "sentence-transformers/all-MiniLM-L6-v2"
    with_env = sie_config("status", model, "--gateway", service.url, env=env)
    assert with_env.exit_code == 1 and with_env.stdout.strip() == f"{service.url}: 400"
    with_flag = sie_config("status", model, "--gateway", service.url, "--token", TOKEN)
    assert with_flag.stdout.strip() == f"{service.url}: 400"
    anonymous = sie_config("status", model, "--gateway", service.url)
    assert anonymous.exit_code == 1 and anonymous.stdout.strip() == f"{service.url}: 401"
