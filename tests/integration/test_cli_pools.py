"""`sie pools …` through the CLI against a real gateway: a `sie run --role all --backend null` process with an
admin token and one static queue pool (`gold`), started once for the module. Tables by default, the raw JSON with
`--json`, every spec flag in the POST body, a second create updating the pool (the public SDK's semantics), times
(unix seconds on the wire) shown as UTC ISO 8601, the token from `--token` or SIE_ADMIN_TOKEN, the gateway from
`--gateway` or SIE_GATEWAY_URL. Exit codes: 0 done, 1 refused by the gateway (its message printed), 2 usage or
connection problem, refused before anything is sent."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner, Result

from launcher import free_port, serving_all
from sie.cli.main import app

TOKEN = "adm1n"
STATIC = "gold"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "rasyosef/splade-tiny"
runner = CliRunner()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a real all-in-one server (null backend: one worker, no model loads); it must exit 0 on
    SIGTERM."""
    env = {"SIE_ADMIN_TOKEN": TOKEN, "SIE_GATEWAY_STATIC_QUEUE_POOLS": STATIC}
    log = tmp_path_factory.mktemp("cli-pools") / "all.log"
    with serving_all(log, ["--backend", "null", "--devices", "cpu"], env) as url:
        yield url


@pytest.fixture(autouse=True)
def no_sie_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads its defaults from SIE_* variables: none leaks in from the shell running the tests."""
    for name in [name for name in os.environ if name.startswith("SIE_")]:
        monkeypatch.delenv(name)


def sie(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, ["pools", *args], env={"COLUMNS": "200", **(env or {})})


def admin(gateway: str) -> tuple[str, ...]:
    return ("--gateway", gateway, "--token", TOKEN)


def get_json(gateway: str, name: str) -> dict:
    shown = sie("get", name, "--json", *admin(gateway))
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.stdout)


def pool_names(gateway: str) -> list[str]:
    listed = sie("list", "--json", "--gateway", gateway)
    assert listed.exit_code == 0, listed.output
    return [pool["spec"]["name"] for pool in json.loads(listed.stdout)["pools"]]


def table_rows(output: str) -> dict[str, str]:
    """A listing's records (one tab-separated line each outside a terminal) by their first field; the header lines
    (`# title`, the column names) left out."""
    lines = [line for line in output.splitlines() if "\t" in line and not line.startswith("#")]
    return {line.split("\t")[0]: line for line in lines if not line.startswith(("name\t", "worker\t"))}


def iso(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat(timespec="seconds")


def the_worker(gateway: str) -> dict:
    """The all-in-one server's one worker, as the gateway's /health lists it."""
    (worker,) = httpx.get(f"{gateway}/health", timeout=10).json()["workers"]
    return worker


def test_create_sends_every_spec_flag_and_shows_the_pool(gateway: str) -> None:
    created = sie(
        "create", "acme", "--gpu", "l4=2", "--gpu", "A100=1", "--gpu-cap", "l4=4", "--queue-pool", STATIC,
        "--bundle", "default", "--min-workers", "1", "--pin", MINILM, "--pin", SPLADE, "--ttl", "600",
        *admin(gateway),
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    assert f"pinned models: {MINILM}, {SPLADE}" in created.stdout
    pool = get_json(gateway, "acme")
    assert pool["spec"] == {
        "name": "acme", "gpus": {"l4": 2, "a100": 1}, "gpu_caps": {"l4": 4}, "queue_pool": STATIC,
        "bundle": "default", "minimum_worker_count": 1, "pinned_models": [MINILM, SPLADE], "ttl_seconds": 600.0,
    }  # fmt: skip
    status = pool["status"]
    assert status["expires_at"] == pytest.approx(status["last_renewed"] + 600.0)
    row = table_rows(created.stdout)["acme"]
    # gold has no worker: nothing is assigned, the pool waits; its expiry is shown in UTC.
    assert "l4=2" in row and "a100=1" in row and "pending" in row and iso(status["expires_at"]) in row
    assert "no workers assigned yet" in created.stdout


def test_a_second_create_updates_the_pool(gateway: str) -> None:
    assert sie("create", "upd", "--gpu", "l4=1", "--min-workers", "2", *admin(gateway)).exit_code == 0
    first = get_json(gateway, "upd")
    again = sie("create", "upd", "--gpu", "l4=3", "--ttl", "120", *admin(gateway))
    assert again.exit_code == 0, again.output
    assert "l4=3" in table_rows(again.stdout)["upd"]
    updated = get_json(gateway, "upd")
    # The new spec replaces the old one whole (the warm floor is back to 0); the lease is renewed, not restarted.
    assert updated["spec"]["gpus"] == {"l4": 3} and updated["spec"]["minimum_worker_count"] == 0
    assert updated["spec"]["ttl_seconds"] == 120.0
    assert updated["status"]["created_at"] == first["status"]["created_at"]
    assert updated["status"]["last_renewed"] >= first["status"]["last_renewed"]
    assert pool_names(gateway).count("upd") == 1


def test_outside_a_terminal_each_pool_is_one_line_whatever_its_name(gateway: str) -> None:
    """Piped, `sie pools list` prints one tab-separated record per pool: a 63-character name is not wrapped across
    lines, so `grep` finds the pool with its state."""
    worker = the_worker(gateway)
    long_name = "p" * 63
    assert sie("create", long_name, "--gpu", f"{worker['machine_profile']}=1", *admin(gateway)).exit_code == 0
    listed = runner.invoke(app, ["pools", "list", "--gateway", gateway], env={"COLUMNS": "40"})
    assert listed.exit_code == 0, listed.output
    (line,) = [line for line in listed.stdout.splitlines() if long_name in line]
    fields = line.split("\t")
    assert fields[0] == long_name and fields[1] in ("active", "pending") and len(fields) == 9
    assert sie("delete", long_name, *admin(gateway)).exit_code == 0


def test_list_and_get_print_tables_or_json(gateway: str) -> None:
    worker = the_worker(gateway)
    profile = worker["machine_profile"]
    assert sie("create", "listed", "--gpu", f"{profile}=1", *admin(gateway)).exit_code == 0
    table = sie("list", "--gateway", gateway)  # reads need no token unless the gateway is in token mode
    assert table.exit_code == 0, table.output
    rows = table_rows(table.stdout)
    assert set(rows) >= {"default (protected)", f"{STATIC} (protected)", "listed"}
    assert f"{profile}=1" in rows["listed"] and "active" in rows["listed"]  # its worker is the default pool's
    assert "never" in rows["default (protected)"]
    names = pool_names(gateway)
    assert names[:2] == ["default", STATIC] and "listed" in names
    listed = [pool for pool in json.loads(sie("list", "--json", "--gateway", gateway).stdout)["pools"]
              if pool["spec"]["name"] == "listed"]  # fmt: skip
    assert all(isinstance(listed[0]["status"][key], float) for key in ("created_at", "last_renewed", "expires_at"))
    one = sie("get", "LISTED", "--gateway", gateway)
    assert one.exit_code == 0, one.output
    assert "assigned workers" in one.stdout
    assert worker["name"] in table_rows(one.stdout.split("assigned workers", 1)[1])


def test_renew_and_delete(gateway: str) -> None:
    env = {"SIE_GATEWAY_URL": gateway, "SIE_ADMIN_TOKEN": TOKEN}  # no flags: both from the environment
    assert sie("create", "brief", "--gpu", "l4=1", env=env).exit_code == 0
    before = get_json(gateway, "brief")["status"]
    renewed = sie("renew", "brief", "--json", env=env)
    assert renewed.exit_code == 0, renewed.output
    after = json.loads(renewed.stdout)["status"]
    assert after["expires_at"] >= before["expires_at"] and after["created_at"] == before["created_at"]
    shown = sie("renew", "brief", env=env)
    assert shown.exit_code == 0, shown.output
    expires = get_json(gateway, "brief")["status"]["expires_at"]
    assert shown.stdout == f"renewed brief: expires at {iso(expires)}\n"
    deleted = sie("delete", "brief", env=env)
    assert (deleted.exit_code, deleted.stdout) == (0, "deleted brief\n")
    gone = sie("get", "brief", "--json", env=env)
    assert gone.exit_code == 1 and "404 pool 'brief' not found" in gone.stderr
    again = sie("delete", "brief", env=env)
    assert again.exit_code == 1 and "404 pool 'brief' not found" in again.stderr
    assert "brief" not in pool_names(gateway)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "acme2", "--gpu", "l4=1"), "401 This route needs the admin token"),
        (("create", "acme2", "--gpu", "l4=1", "--token", "not-it"), "403 This route needs the admin token"),
        (("delete", "default", "--token", "not-it"), "403 This route needs the admin token"),
        (("renew", "default"), "401 This route needs the admin token"),
    ],
)
def test_without_the_admin_token_writes_are_refused(gateway: str, args: tuple[str, ...], message: str) -> None:
    before = pool_names(gateway)
    result = sie(*args, "--gateway", gateway)
    assert result.exit_code == 1 and message in result.stderr
    assert pool_names(gateway) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("delete", "default"), "403 pool 'default' is protected"),
        (("delete", STATIC), f"403 pool '{STATIC}' is protected"),
        (("create", STATIC, "--gpu", "l4=1"), f"403 pool '{STATIC}' is protected"),
        (("get", "nobody"), "404 pool 'nobody' not found"),
        (("renew", "nobody"), "404 pool 'nobody' not found"),
        (("delete", "nobody"), "404 pool 'nobody' not found"),
    ],
)
def test_protected_and_unknown_pools_are_refused(gateway: str, args: tuple[str, ...], message: str) -> None:
    result = sie(*args, *admin(gateway))
    assert result.exit_code == 1 and message in result.stderr
    assert pool_names(gateway)[:2] == ["default", STATIC]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bad.name", "--gpu", "l4=1"), "400 invalid pool name 'bad.name'"),
        (("acme3", "--gpu", "l4=1", "--queue-pool", "silver"), "400 queue_pool 'silver' is not a queue pool"),
        (("acme3", "--gpu", "l4=1", "--gpu-cap", "a100=1"), "400 'gpu_caps' caps machine profiles ['a100']"),
        (("acme3", "--gpu", "l4=1", "--ttl", "1e9"), "400 'ttl_seconds' must lie from 1 to"),
        (("acme3", "--gpu", "l4=1000000"), "400 'gpus[l4]' must be a whole number from 1 to"),
    ],
)
def test_spec_the_gateway_refuses_exits_1_with_its_message(gateway: str, args: tuple[str, ...], message: str) -> None:
    before = pool_names(gateway)
    result = sie("create", *args, *admin(gateway))
    assert result.exit_code == 1 and message in result.stderr
    assert pool_names(gateway) == before


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
def test_create_refuses_bad_flags_before_asking(gateway: str, args: tuple[str, ...], message: str) -> None:
    before = pool_names(gateway)
    result = sie("create", "flagged", *args, *admin(gateway))
    assert result.exit_code == 2 and message in result.stderr
    assert pool_names(gateway) == before


def test_an_unreachable_gateway_exits_2() -> None:
    result = sie("list", "--gateway", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2 and "cannot reach" in result.stderr
