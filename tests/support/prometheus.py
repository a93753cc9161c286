"""A real Prometheus server (Debian `prometheus`, installed by `make tools`) scraping loopback targets every second,
queried through its HTTP API; `promtool check metrics` on an exposition text; and a counter's samples read from an
in-process exposition (`counts_by`)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from launcher import free_port
from support.polling import holds_within

SCRAPE_INTERVAL = "1s"


def installed_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: `make tools` installs the Debian package prometheus")
    return path


def promtool_problems(text: str) -> str:
    """What `promtool check metrics` finds wrong with an exposition text ("" when nothing)."""
    checked = subprocess.run(
        [installed_binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return "" if checked.returncode == 0 else checked.stdout + checked.stderr


class Prometheus:
    """A running server: `query(expr)` answers the instant vector as {frozenset(labels): value}."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.url = url
        self.process = process
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def query(self, expr: str) -> dict[frozenset[tuple[str, str]], float]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        if answer.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {answer}")
        return {frozenset(sample["metric"].items()): float(sample["value"][1]) for sample in answer["data"]["result"]}

    def total(self, expr: str) -> float:
        """The sum of `expr`'s samples (0 while it has none)."""
        return sum(self.query(expr).values())


@contextlib.contextmanager
def prometheus(root: Path, targets: Mapping[str, str]) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port scraping `targets` (job name → `host:port`, path /metrics) every second,
    storing in `root`; stopped when the block ends."""
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n" for job, target in targets.items()
    )
    config = root / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\nscrape_configs:\n{jobs}"
    )
    port = free_port()
    log_path = root / "prometheus.log"
    command = [
        installed_binary("prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}", process, log_path)
    try:
        if not holds_within(lambda: _ready(server), 60.0, interval_s=0.2):
            raise TimeoutError(f"prometheus not ready:\n{server.log()}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(server: Prometheus) -> bool:
    if server.process.poll() is not None:
        raise RuntimeError(f"prometheus exited with {server.process.returncode}:\n{server.log()}")
    try:
        return httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def counts_by(telemetry: Any, series: str, label: str) -> dict[str, float]:
    """The samples of counter `series` in `telemetry`'s exposition by the value of `label`, those still at 0 left
    out (counters that start every series at 0 list the ones not met yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = telemetry.prometheus_text().decode()
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    return {sample.labels[label]: sample.value for sample in samples if sample.name == series and sample.value}
