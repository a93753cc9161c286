"""SIE's alerting rules (deploy/helm/sie/files/alerts.yaml) with the real promtool: `promtool check rules` passes,
`promtool test rules` shows each alert firing on the series that should fire it and quiet on the ones that should
not (tests/deploy/alerts_test.yaml), and the chart ships exactly these rules as a PrometheusRule. That every series
the rules read exists in a real scrape is checked against running processes in tests/e2e/test_metrics.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from support.helm import REPO, render
from support.prometheus import installed_binary

CHART = REPO / "deploy" / "helm" / "sie"
RULES = CHART / "files" / "alerts.yaml"
TESTS = Path(__file__).with_name("alerts_test.yaml")
SERIES = re.compile(r"\bsie_[a-z0-9_]+")


def rule_series() -> set[str]:
    """Every `sie_*` series the rules' expressions read."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {name for group in groups for rule in group["rules"] for name in SERIES.findall(rule["expr"])}


def promtool(*arguments: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [installed_binary("promtool"), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def test_the_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout + result.stderr


def test_each_alert_fires_and_stays_quiet_when_it_should() -> None:
    result = promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load(TESTS.read_text(encoding="utf-8"))["tests"]
    tested = {case["alertname"] for test in tests for case in test["alert_rule_test"]}
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    assert tested == {rule["alert"] for group in groups for rule in group["rules"]}  # every alert has a test


def test_the_chart_ships_the_rules_as_a_prometheus_rule(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("prometheusRule:\n  enabled: true\n  labels:\n    release: prom\n")
    (rule,) = [m for m in render(CHART, values) if m["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    assert not [m for m in render(CHART) if m["kind"] == "PrometheusRule"]  # off unless asked for
    assert rule_series() >= {"sie_gateway_requests_total", "sie_gateway_lane_queue_depth"}
