"""`sie run --role all --devices cpu:2` with lpt_packing as an operator meets it: requests over HTTP, the
placement shown by `sie placement status`, a replica added with `set-replicas` + `repack --wait`, the new
placement serving, `/metrics` telling the same story, bad knobs refused. Marked slow: real server process.
The `sie placement` commands run in this process (typer's runner): the same app a shell runs, without starting an
interpreter per command (about 1 s each, several on busy cores)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner, Result

from launcher import RoleProcess, free_port, holds_within
from sie.cli.main import app

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("placement")
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--devices", "cpu:2"]
    env = {"SIE_PLACEMENT_MODE": "lpt_packing", "SIE_PLACEMENT_PROBE_INTERVAL_S": "0.3"}
    process = RoleProcess("all", args, env, root / "server.log")
    try:
        process.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        yield f"http://127.0.0.1:{port}"
    finally:
        code = process.stop()
    assert code == 0, process.log()


def sie_placement(url: str, *args: str) -> Result:
    """`sie placement ARGS --url URL`."""
    return CliRunner().invoke(app, ["placement", *args, "--url", url])


def encode(url: str, count: int) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for index in range(count):
            body = {"items": [{"text": f"sentence {index} {j}"} for j in range(1 + index % 4)]}
            response = client.post(f"/v1/encode/{MINILM}", json=body)
            assert response.status_code == 200, response.text
            assert len(response.json()["items"]) == len(body["items"])


def status(url: str) -> dict:
    result = sie_placement(url, "status", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def replicas_of(state: dict) -> dict[str, int]:
    (model,) = [entry for entry in state["models"] if entry["model"] == MINILM]
    return {replica["worker"]: replica["routed_batches"] for replica in model["replicas"]}


def metric(url: str, name: str, labels: dict[str, str]) -> float | None:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items()):
                return sample.value
    return None


def test_an_operator_adds_a_replica_and_the_model_runs_on_both_children(server: str) -> None:
    encode(server, 6)
    state = status(server)
    assert state["mode"] == "lpt_packing" and [child["device"] for child in state["children"]] == ["cpu", "cpu"]
    (host,) = replicas_of(state)  # one replica by default: every batch went to one child
    assert metric(server, "sie_placement_model_replicas", {"model": MINILM}) == 1.0

    changed = sie_placement(server, "set-replicas", MINILM, "2", "--fill-mode", "spread")
    assert changed.exit_code == 0, changed.stderr
    repacked = sie_placement(server, "repack", "--wait", "60")
    assert repacked.exit_code == 0, repacked.stderr

    encode(server, 12)
    routed = replicas_of(status(server))
    assert set(routed) == {"worker-0", "worker-1"} and all(count > 0 for count in routed.values()), routed
    other = "worker-1" if host == "worker-0" else "worker-0"
    assert metric(server, "sie_placement_replica_routed_total", {"model": MINILM, "worker": other}) > 0
    assert metric(server, "sie_placement_model_replicas", {"model": MINILM}) == 2.0
    assert metric(server, "sie_placement_repacks_total", {"trigger": "manual"}) >= 1
    assert metric(server, "sie_worker_batch_items_count", {"model": MINILM, "worker": host}) > 0

    # Back to one replica: the repack takes the model off one child, and compaction unloads it there.
    changed = sie_placement(server, "set-replicas", MINILM, "1")
    assert changed.exit_code == 0, changed.stderr
    repacked = sie_placement(server, "repack", "--wait", "60")
    assert repacked.exit_code == 0, repacked.stderr

    def compacted() -> bool:
        state = status(server)
        hosting = [child["name"] for child in state["children"] if MINILM in child["loaded_models"]]
        return len(hosting) == 1 and state["compaction"]["unloads_total"] >= 1

    assert holds_within(compacted, 30.0), f"compaction did not unload {MINILM} from the child it left: {status(server)}"
    assert metric(server, "sie_placement_compaction_unloads_total", {}) >= 1
    assert metric(server, "sie_placement_compaction_freed_bytes_total", {}) > 0
    shown = sie_placement(server, "status")
    assert "models unloaded" in shown.stdout, shown.stdout
    encode(server, 4)  # the remaining replica serves


def test_bad_knobs_are_refused_with_the_reason(server: str) -> None:
    refused = sie_placement(server, "set-policy", "mode=round_robin")
    assert refused.exit_code == 1 and "mode" in (refused.stdout + refused.stderr)
    refused = sie_placement(server, "set-policy", "hysteresis=-1")
    assert refused.exit_code == 1 and "hysteresis" in (refused.stdout + refused.stderr)
    accepted = sie_placement(server, "set-policy", "hysteresis=0.15", "routing_policy=fill_rr")
    assert accepted.exit_code == 0, accepted.stderr
    assert status(server)["policy"]["hysteresis"] == 0.15
    bad_value = httpx.post(f"{server}/v1/placement/models/{MINILM}", json={"replicas": 0}, timeout=10)
    assert bad_value.status_code == 400 and bad_value.json()["error"]["code"] == "bad_request"
