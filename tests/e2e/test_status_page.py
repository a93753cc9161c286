"""The status page in a real browser: `sie run --role all` as a process, headless Debian chromium driven through
its chromedriver (Selenium), live traffic, and the page showing a healthy worker and a loaded model once the
websocket has updated it; a screenshot is kept. `/docs` draws the OpenAPI description, and the public sie-sdk's
`watch()` reads the same websocket. A distributed gateway (`--role gateway` on NATS) pushes its worker, heard
through heartbeats, and its pool's JetStream depth. Marked slow: it starts real servers and a browser."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from websockets.sync.client import connect

from launcher import Cluster

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
CHROMEDRIVER = "/usr/bin/chromedriver"
PAGE_WAIT_S = 30.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """Headless chromium; missing, it fails the test (`make test` installs it: the Makefile's `tools`)."""
    binary = shutil.which("chromium")
    if binary is None or not Path(CHROMEDRIVER).exists():
        raise RuntimeError("chromium and chromium-driver are not installed; `make tools` installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1100", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def page_state(driver: webdriver.Chrome) -> dict:
    """What the page shows now, read from its DOM."""
    workers = driver.find_elements(By.CSS_SELECTOR, "#workers tr[data-worker]")
    models = driver.find_elements(By.CSS_SELECTOR, "#models tr[data-model]")
    return {
        "connection": driver.find_element(By.ID, "connection").text,
        "healthy_workers_with_minilm": [
            row.get_attribute("data-worker")
            for row in workers
            if row.get_attribute("data-healthy") == "true" and MINILM in row.get_attribute("data-loaded").split(",")
        ],
        "model_states": {row.get_attribute("data-model"): row.get_attribute("data-state") for row in models},
        "requests_per_s": driver.find_element(By.ID, "rps").text,
    }


def shows_live_cluster(driver: webdriver.Chrome) -> dict | None:
    try:
        state = page_state(driver)
    except StaleElementReferenceException:
        return None  # the page redrew its tables while we read them
    serving = state["requests_per_s"] not in ("–", "0.00")
    live = state["connection"] == "live" and state["healthy_workers_with_minilm"]
    return state if live and state["model_states"].get(MINILM) == "loaded" and serving else None


@contextlib.contextmanager
def traffic(base_url: str, max_requests: int = 5000) -> Iterator[list[int]]:
    """Encode requests sent one after another in a thread while the block runs; yields their status codes."""
    statuses: list[int] = []
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            texts = itertools.cycle(["Hello world", "a status page", "a live view of the cluster"])
            for text in itertools.islice(texts, max_requests):
                if stop.is_set():
                    return
                statuses.append(client.post(f"/v1/encode/{MINILM}", json={"items": [{"text": text}]}).status_code)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield statuses
    finally:
        stop.set()
        sender.join(timeout=60)


def test_the_page_shows_a_live_worker_and_a_loaded_model(all_server: str, browser, tmp_path: Path) -> None:
    browser.get(f"{all_server}/")
    assert browser.title == "SIE status"
    with traffic(all_server) as statuses:
        state = WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.2).until(shows_live_cluster)
    assert statuses and set(statuses) == {200}
    assert state["healthy_workers_with_minilm"] and float(state["requests_per_s"]) > 0
    assert "acme/ghost" in state["model_states"]  # the whole catalogue is listed, not only what is loaded
    screenshot = tmp_path / "status-page.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes().startswith(PNG_SIGNATURE)


def test_docs_page_lists_the_routes_from_openapi_json(all_server: str, browser) -> None:
    browser.get(f"{all_server}/docs")

    def encode_listed(driver: webdriver.Chrome) -> bool:
        return bool(driver.find_elements(By.CSS_SELECTOR, '.operation[data-path="/v1/encode/{model}"]'))

    WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.2).until(encode_listed)
    listed = {
        (card.get_attribute("data-method"), card.get_attribute("data-path"))
        for card in browser.find_elements(By.CSS_SELECTOR, ".operation")
    }
    document = httpx.get(f"{all_server}/openapi.json", timeout=10).json()
    assert listed == {(method, path) for path, operations in document["paths"].items() for method in operations}
    assert ("post", "/v1/placement/policy") in listed  # `--role all` serves the placement surface


def test_public_sdk_watch_reads_the_cluster_status(all_server: str, public_sdk) -> None:
    client = public_sdk.SIEClient(all_server)
    try:
        messages = client.watch(mode="auto")  # a gateway by its /health, so /ws/cluster-status
        first = next(messages)
        messages.close()
    finally:
        client.close()
    assert first["cluster"]["worker_count"] >= 1
    assert any(MINILM in worker["loaded_models"] for worker in first["workers"])
    assert {"name": MINILM, "state": "loaded"}.items() <= next(
        m for m in first["models"] if m["name"] == MINILM
    ).items()


def test_the_distributed_gateway_pushes_its_workers_and_pool_depth(cluster: Cluster) -> None:
    page = httpx.get(f"{cluster.url}/", timeout=10)
    assert page.status_code == 200 and "/ws/cluster-status" in page.text
    assert "/ws/cluster-status" in httpx.get(f"{cluster.url}/openapi.json", timeout=10).json()["paths"]
    with connect(cluster.url.replace("http://", "ws://") + "/ws/cluster-status", open_timeout=10) as socket:
        snapshot = orjson.loads(socket.recv(timeout=10))
    (worker,) = snapshot["workers"]
    assert worker["name"] == "w-1" and worker["healthy"] and MINILM in worker["loaded_models"]
    assert isinstance(snapshot["queue"]["pools"]["default"], int)  # read from the WORK_POOL_default stream
    assert snapshot["status"] == "healthy" and snapshot["cluster"]["worker_count"] == 1
