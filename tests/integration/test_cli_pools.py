"""`sie pools …` through the CLI over real HTTP, against a stand-in for the gateway's `/v1/pools` routes
(tests/support/pools_gateway.py, the shared contract's shape and error envelopes): tables by default, the raw JSON
with `--json`, every spec flag in the POST body, the token from `--token` or SIE_ADMIN_TOKEN, the gateway from
`--gateway` or SIE_GATEWAY_URL. Exit codes: 0 done, 1 refused by the gateway (its message printed), 2 usage or
connection problem."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from sie.cli.main import app
from support.pools_gateway import PoolsGateway, pool_json
from support.servers import free_port

TOKEN = "adm1n"
runner = CliRunner()


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[PoolsGateway]:
    for name in [name for name in os.environ if name.startswith("SIE_")]:
        monkeypatch.delenv(name)
    stand_in = PoolsGateway()
    stand_in.put(pool_json("gold", queue_pool="gold", protected=True))
    with stand_in.running():
        yield stand_in


def sie(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["pools", *args], env={"COLUMNS": "200", **(env or {})})


def test_create_sends_every_spec_flag_and_shows_the_pool(gateway: PoolsGateway) -> None:
    created = sie(
        "create", "acme", "--gpu", "l4=2", "--gpu", "A100=1", "--gpu-cap", "l4=4", "--queue-pool", "gold",
        "--bundle", "default", "--min-workers", "1", "--pin", "BAAI/bge-m3", "--pin", "org/m:fast", "--ttl", "600",
        "--gateway", gateway.url, "--token", TOKEN,
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    assert (
        "acme" in created.stdout
        and "l4=2" in created.stdout
        and "pinned models: BAAI/bge-m3, org/m:fast" in (created.stdout)
    )
    shown = sie("get", "acme", "--json", "--gateway", gateway.url, "--token", TOKEN)
    assert shown.exit_code == 0, shown.output
    spec = json.loads(shown.stdout)["spec"]
    assert spec == {
        "name": "acme", "gpus": {"l4": 2, "a100": 1}, "gpu_caps": {"l4": 4}, "queue_pool": "gold",
        "bundle": "default", "minimum_worker_count": 1, "pinned_models": ["BAAI/bge-m3", "org/m:fast"],
        "ttl_seconds": 600.0,
    }  # fmt: skip
    assert gateway.requests[0] == ("POST", "/v1/pools", f"Bearer {TOKEN}")


def test_list_and_get_print_tables_or_json(gateway: PoolsGateway) -> None:
    gateway.put(pool_json("acme", gpus={"l4": 1}, gpu_caps={"l4": 1}, assigned=["worker-7"]))
    table = sie("list", "--gateway", gateway.url)
    assert table.exit_code == 0, table.output
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if line.count("│") > 2}
    assert set(rows) >= {"default (protected)", "gold (protected)", "acme"}
    assert "l4=1" in rows["acme"] and "active" in rows["acme"]
    raw = sie("list", "--json", "--gateway", gateway.url)
    assert [pool["spec"]["name"] for pool in json.loads(raw.stdout)["pools"]] == ["default", "gold", "acme"]
    one = sie("get", "ACME", "--gateway", gateway.url)
    assert one.exit_code == 0, one.output
    assert "worker-7" in one.stdout and "assigned workers" in one.stdout


def test_renew_and_delete(gateway: PoolsGateway) -> None:
    env = {"SIE_GATEWAY_URL": gateway.url, "SIE_ADMIN_TOKEN": TOKEN}  # no flags: both from the environment
    assert sie("create", "acme", "--gpu", "l4=1", env=env).exit_code == 0
    renewed = sie("renew", "acme", env=env)
    assert renewed.exit_code == 0, renewed.output
    assert renewed.stdout.startswith("renewed acme: expires at ") and gateway.renewals == 1
    deleted = sie("delete", "acme", env=env)
    assert (deleted.exit_code, deleted.stdout) == (0, "deleted acme\n")
    assert {auth for _, _, auth in gateway.requests} == {f"Bearer {TOKEN}"}
    gone = sie("get", "acme", "--json", env=env)
    assert gone.exit_code == 1 and "404 pool 'acme' not found" in gone.stderr


def test_the_gateways_refusals_exit_1_with_their_message(gateway: PoolsGateway) -> None:
    assert sie("create", "acme", "--gpu", "l4=1", "--gateway", gateway.url).exit_code == 0
    again = sie("create", "acme", "--gpu", "l4=1", "--gateway", gateway.url)
    assert again.exit_code == 1 and "409 pool 'acme' already exists" in again.stderr
    protected = sie("delete", "default", "--gateway", gateway.url)
    assert protected.exit_code == 1 and "403 pool 'default' is protected" in protected.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "create needs at least one --gpu PROFILE=COUNT"),
        (("--gpu", "l4"), "--gpu 'l4': expected PROFILE=COUNT"),
        (("--gpu", "l4=two"), "'two' is not a whole number"),
        (("--gpu", "l4=0"), "the count must be at least 1"),
        (("--gpu", "l4=1", "--gpu", "L4=2"), "names machine profile 'l4' twice"),
        (("--gpu", "l4=1", "--gpu-cap", "l4=-1"), "the count must be at least 0"),
    ],
)
def test_create_refuses_bad_flags_before_asking(gateway: PoolsGateway, args: tuple[str, ...], message: str) -> None:
    result = sie("create", "acme", *args, "--gateway", gateway.url)
    assert result.exit_code == 2 and message in result.stderr
    assert gateway.requests == []


def test_an_unreachable_gateway_exits_2() -> None:
    result = sie("list", "--gateway", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2 and "cannot reach" in result.stderr
