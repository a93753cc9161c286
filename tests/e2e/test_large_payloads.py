"""Large payloads through real processes (issue 13 §3): nats-server with a 64 KiB max_payload, `sie run --role
gateway|sidecar|worker`, and a local payload store both roles name in SIE_PAYLOAD_STORE_URL. Results far larger
than a broker message come back whole (result_chunk_v1), and items larger than one go through the store, which is
empty again afterwards. Marked slow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from support.nats_server import NatsServer
from support.polling import holds_within
from support.servers import RoleProcess, free_port

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MAX_PAYLOAD = 64 * 1024
LONG_TEXT = " ".join(f"word{index % 97} stands beside token{index % 89}" for index in range(300))


class Cluster:
    """nats-server, worker, sidecar and gateway on loopback, sharing one payload store directory."""

    def __init__(self, root: Path) -> None:
        self.nats = NatsServer(root, max_payload=MAX_PAYLOAD)
        self.store = root / "payloads"
        socket = root / "worker.sock"
        worker_env = {"SIE_IPC_SOCKET_PATH": str(socket), "SIE_WORKER_ID": "w-large"}
        broker = {"SIE_NATS_URL": self.nats.url, "SIE_PAYLOAD_STORE_URL": str(self.store)}
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.worker = RoleProcess("worker", ["--preload", MINILM], worker_env, root / "worker.log")
        self.sidecar = RoleProcess(
            "sidecar", ["--port", str(free_port()), "--health-interval-s", "0.2"], {**worker_env, **broker},
            root / "sidecar.log",
        )  # fmt: skip
        self.gateway = RoleProcess(
            "gateway", ["--host", "127.0.0.1", "--port", str(port), "--gateway-request-timeout", "60"], broker,
            root / "gateway.log",
        )  # fmt: skip

    def wait_serving(self) -> None:
        self.gateway.wait_http_ready(f"{self.url}/readyz")

        def encodes() -> bool:
            response = httpx.post(f"{self.url}/v1/encode/{MINILM}", json={"items": [{"text": "ping"}]}, timeout=60)
            return response.status_code == 200

        if not holds_within(encodes, 120.0, interval_s=0.2):
            raise TimeoutError(f"cluster not serving:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(process.log() for process in (self.gateway, self.sidecar, self.worker))

    def stop(self) -> None:
        for process in (self.gateway, self.sidecar, self.worker):
            process.stop()
        self.nats.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    deployment = Cluster(tmp_path_factory.mktemp("large-payloads"))
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.stop()


def test_a_multivector_encode_of_many_long_texts_comes_back_whole(cluster: Cluster) -> None:
    body = {
        "items": [{"id": f"t{index}", "text": f"{index} {LONG_TEXT}"} for index in range(16)],
        "params": {"output_types": ["multivector"], "options": {"profile": "multivector"}},
    }
    response = httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json=body, timeout=120)
    assert response.status_code == 200, f"{response.text}\n{cluster.logs()}"
    items = response.json()["items"]
    assert [item["id"] for item in items] == [f"t{index}" for index in range(16)]
    for item in items:
        vectors = np.asarray(item["multivector"]["values"], dtype=np.float32)
        assert vectors.shape[1] == 384 and vectors.nbytes > 5 * MAX_PAYLOAD  # only result chunks carry that


def test_items_larger_than_a_broker_message_go_through_the_payload_store(cluster: Cluster) -> None:
    items = [{"id": f"big-{index}", "text": f"{index} " + "lorem ipsum dolor sit amet " * 3000} for index in range(3)]
    response = httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json={"items": items}, timeout=120)
    assert response.status_code == 200, f"{response.text}\n{cluster.logs()}"
    assert [len(item["dense"]["values"]) for item in response.json()["items"]] == [384, 384, 384]
    assert cluster.store.is_dir()  # the gateway wrote there: no item this size fits a broker message

    def store_emptied() -> bool:
        return not any(cluster.store.iterdir())

    assert holds_within(store_emptied, 10.0, interval_s=0.05), sorted(path.name for path in cluster.store.iterdir())
