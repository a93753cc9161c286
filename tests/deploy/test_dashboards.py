"""SIE's Grafana dashboards (deploy/helm/sie/files/dashboards/*.json): each is well-formed (uid, title, unique panel
ids, a Prometheus `datasource` variable every panel reads through, an `expr` in every target), every query passes
the real promtool (written as recording rules), and the chart ships each as a ConfigMap the Grafana sidecar picks
up. That every series the dashboards read exists in a real scrape is checked in tests/e2e/test_metrics.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from deploy.test_alerts import SERIES, promtool
from support.helm import REPO, render

CHART = REPO / "deploy" / "helm" / "sie"
DASHBOARDS = sorted((CHART / "files" / "dashboards").glob("*.json"))
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's variables in queries, with the values promtool checks them at.
GRAFANA_VARIABLES = {"$__rate_interval": "5m"}
RANGE = re.compile(r"\[([^\]]+)\]")
# The ConfigMap names of release `sie-test` (support.helm.render) start so.
SHIPPED = "sie-test-dashboard-"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel of `board`, those inside rows included."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries() -> Iterator[tuple[str, int, str, str]]:
    """(dashboard uid, panel id, refId, expr) of every target of every dashboard."""
    for path in DASHBOARDS:
        board = load(path)
        for panel in panels(board):
            for target in panel.get("targets", []):
                yield board["uid"], panel["id"], target["refId"], target["expr"]


def dashboard_series() -> set[str]:
    """Every `sie_*` series the dashboards' queries read."""
    return {name for _, _, _, expr in queries() for name in SERIES.findall(expr)}


def test_every_dashboard_is_well_formed() -> None:
    assert len(DASHBOARDS) >= 3
    uids = [load(path)["uid"] for path in DASHBOARDS]
    assert len(set(uids)) == len(uids), uids
    for path in DASHBOARDS:
        board = load(path)
        assert board["uid"] and board["title"].startswith("SIE / ") and board["schemaVersion"] == 39, path.name
        (variable,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert variable["type"] == "datasource" and variable["query"] == "prometheus", path.name
        ids = [panel["id"] for panel in panels(board)]
        assert len(set(ids)) == len(ids), f"{path.name}: panel ids repeat: {ids}"
        for panel in panels(board):
            if panel["type"] == "row":
                continue
            assert panel["type"] in {"timeseries", "stat"} and panel["title"], (path.name, panel["id"])
            assert panel["datasource"] == DATASOURCE and panel["targets"], (path.name, panel["id"])
            for target in panel["targets"]:
                assert target["datasource"] == DATASOURCE and target["expr"].strip(), (path.name, panel["id"])


def test_rates_use_the_rate_interval() -> None:
    ranges = {(uid, panel, ref): RANGE.findall(expr) for uid, panel, ref, expr in queries()}
    assert {key: found for key, found in ranges.items() if set(found) - {"$__rate_interval"}} == {}


def test_every_query_passes_promtool(tmp_path: Path) -> None:
    rules = []
    for uid, panel, ref, expr in queries():
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{uid} panel {panel} {ref}: a Grafana variable promtool cannot read: {expr}"
        rules.append({"record": f"dashboard:{uid.replace('-', '_')}:panel_{panel}_{ref}", "expr": expr})
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


def test_the_chart_ships_one_config_map_per_dashboard(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("grafanaDashboards:\n  enabled: true\n  folder: SIE\n  labels:\n    team: ml\n")
    maps = {m["metadata"]["name"]: m for m in render(CHART, values) if m["kind"] == "ConfigMap"}
    shipped = {name: m for name, m in maps.items() if name.startswith(SHIPPED)}
    assert sorted(shipped) == sorted(f"{SHIPPED}{path.stem}" for path in DASHBOARDS)
    for path in DASHBOARDS:
        config_map = shipped[f"{SHIPPED}{path.stem}"]
        labels = config_map["metadata"]["labels"]
        assert labels["grafana_dashboard"] == "1" and labels["team"] == "ml"
        assert labels["app.kubernetes.io/instance"] == "sie-test" and labels["app.kubernetes.io/part-of"] == "sie"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "SIE"}
        assert config_map["data"] == {path.name: path.read_text(encoding="utf-8")}
    values.write_text("grafanaDashboards:\n  enabled: true\n  label: dashboards\n  labelValue: sie\n")
    relabelled = [m for m in render(CHART, values) if m["metadata"]["name"].startswith(SHIPPED)]
    assert len(relabelled) == len(DASHBOARDS)
    for config_map in relabelled:
        metadata = config_map["metadata"]
        assert metadata["labels"]["dashboards"] == "sie" and "grafana_dashboard" not in metadata["labels"]
        assert "annotations" not in metadata  # no folder, no annotation
    assert not [m for m in render(CHART) if m["metadata"]["name"].startswith(SHIPPED)]  # off by default


def test_the_dashboards_cover_what_an_operator_watches() -> None:
    assert dashboard_series() >= {
        "sie_gateway_requests_total", "sie_gateway_request_duration_seconds_bucket",
        "sie_gateway_admission_decisions_total", "sie_gateway_lane_queue_depth", "sie_gateway_lane_pending",
        "sie_gateway_lane_pending_demand", "sie_gateway_pool_warm_floor", "sie_gateway_publish_acks_total",
        "sie_gateway_dead_letters_total", "sie_gateway_republished_items_total", "sie_worker_batch_fill_bucket",
        "sie_worker_batch_items_bucket", "sie_worker_batch_tokens_bucket", "sie_worker_queue_duration_seconds_bucket",
        "sie_worker_tokenization_duration_seconds_bucket", "sie_worker_inference_duration_seconds_bucket",
        "sie_worker_batches_total", "sie_placement_model_replicas", "sie_placement_replica_routed_total",
        "sie_worker_memory_bytes", "sie_worker_model_memory_bytes", "sie_worker_model_loads_total",
        "sie_worker_model_evictions_total", "sie_worker_model_state", "sie_nats_connected",
        "sie_gateway_config_applied_epoch", "sie_gateway_config_operations_total",
        "sie_gateway_config_bootstrap_degraded",
    }  # fmt: skip
