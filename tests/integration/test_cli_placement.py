"""`sie placement …` through the CLI against a real ProbeServer serving PlacementApi over a fake control on a
free loopback port. Exit codes: 0 ok, 1 refused by the server (its message printed), 2 usage or connection."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner, Result

from sie.cli.main import app
from sie.placement.api import PlacementApi, snapshot_document
from sie.placement.policy import ROUND_ROBIN, ModelOverride, PlacementPolicy
from sie.sidecar.pod.probes import ProbeServer
from support.placement_fakes import BGE, MINI, FakeControl

HOST = "127.0.0.1"
runner = CliRunner()


@pytest.fixture()
def control() -> FakeControl:
    return FakeControl()


@pytest.fixture()
async def url(control: FakeControl):
    async with ProbeServer(lambda: True, 0, HOST, routes=PlacementApi(control).handle) as probes:
        yield f"http://{HOST}:{probes.port}"


async def sie(*args: str) -> Result:
    """Run the CLI off the event loop, so the server on this loop answers it."""
    return await asyncio.to_thread(runner.invoke, app, ["placement", *args])


async def test_status_prints_tables(url: str) -> None:
    result = await sie("status", "--url", url)
    assert result.exit_code == 0, result.output
    for text in ("lpt_packing", "worker-0", "worker-2", "cuda:1", BGE, "repacks: 3", "last by manual"):
        assert text in result.stdout


async def test_status_json_is_the_raw_document(url: str, control: FakeControl) -> None:
    result = await sie("status", "--json", "--url", url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(json.dumps(snapshot_document(control.snapshot())))


async def test_set_replicas(url: str, control: FakeControl) -> None:
    result = await sie("set-replicas", BGE, "2", "--fill-mode", "spread", "--fill-factor", "0.5", "--url", url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["effective"] == "next repack"
    assert (await sie("set-replicas", MINI, "all", "--url", url)).exit_code == 0
    assert control.policy.models == {BGE: ModelOverride(2, "spread", 0.5), MINI: ModelOverride("all")}


async def test_set_replicas_refusals(url: str, control: FakeControl) -> None:
    refused = await sie("set-replicas", BGE, "0", "--url", url)
    assert refused.exit_code == 1
    assert "error: 400 replicas 0 is not a whole number >= 1 or 'all'" in refused.stderr
    assert (await sie("set-replicas", BGE, "two", "--url", url)).exit_code == 2
    assert control.policy.models == {}


async def test_set_policy(url: str, control: FakeControl) -> None:
    knobs = ["hysteresis=0.15", "routing_policy=fill_rr", "forbid_memory_oversubscription=false"]
    result = await sie("set-policy", *knobs, "--url", url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["routing_policy"] == "fill_rr"
    assert (control.policy.hysteresis, control.policy.forbid_memory_oversubscription) == (0.15, False)
    unknown = await sie("set-policy", "speed=3", "--url", url)
    assert unknown.exit_code == 1 and "speed" in unknown.stderr
    assert (await sie("set-policy", "hysteresis", "--url", url)).exit_code == 2


async def test_repack(url: str, control: FakeControl) -> None:
    result = await sie("repack", "--wait", "1.5", "--url", url)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["moved"] == [BGE]
    assert control.waits == [1.5]
    assert (await sie("repack", "--wait", "-1", "--url", url)).exit_code == 2


async def test_repack_outside_lpt_packing_is_refused(url: str, control: FakeControl) -> None:
    control.policy = PlacementPolicy(mode=ROUND_ROBIN)
    result = await sie("repack", "--url", url)
    assert result.exit_code == 1
    assert "repack needs scheduling mode lpt_packing; the mode is round_robin" in result.stderr


async def test_no_server_is_a_connection_problem() -> None:
    async with ProbeServer(lambda: True, 0, HOST) as probes:
        port = probes.port
    result = await sie("status", "--url", f"http://{HOST}:{port}")
    assert result.exit_code == 2
    assert "cannot reach" in result.stderr
