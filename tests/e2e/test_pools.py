"""Pools end to end with a real nats-server (seed 000 §2, §16.3; issue 16): two gateway replicas sharing the pool
store in the broker's KV bucket, two workers whose sidecars poll a gateway's `/v1/pools` for their admission, a
capped pool whose work only its assigned worker runs, leases that expire, named pools that fail closed, demand that
a cold lane records, and a worker holding another config that is not auto-routed.

The two pool workers run the null backend (the subject is routing, not inference); the stale worker runs MiniLM
from a catalogue with one model more, so the bundle_config_hash it reports is not the gateways'.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import NotFoundError

from launcher import REPO, NatsServer, RoleProcess, free_port
from sie.catalog.names import work_pool_stream_name
from support.model_files import minilm_copy
from support.polling import holds_within

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ENCODE = f"/v1/encode/{MINILM}"
TEXT = {"items": [{"text": "hello"}]}
HEALTH = ["--health-interval-s", "0.2"]
PINNED = "sentence-transformers/paraphrase-MiniLM-L3-v2"  # a model no other test here asks for


class Deployment:
    """nats-server, gateways `a` and `b`, workers w-1 and w-2 (null backend, sidecars polling gateway a's pools
    every 0.3 s) and w-stale (MiniLM on machine profile `stale`, from a catalogue one model larger)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nats = NatsServer(root)
        self.processes: list[RoleProcess] = []
        self.probes: dict[str, str] = {}  # worker id -> its sidecar's probe URL (/metrics)
        self.a, self.b = self._gateway("a"), self._gateway("b")
        for worker_id in ("w-1", "w-2"):
            self._worker(worker_id, ["--backend", "null"], {})
        catalogue = root / "stale-models"
        shutil.copytree(REPO / "config" / "models", catalogue)
        minilm_copy(catalogue, "test/one-model-more")
        self._worker(
            "w-stale", ["--preload", MINILM], {"SIE_MODELS_DIR": str(catalogue)}, {"SIE_MACHINE_PROFILE": "stale"}
        )

    def _gateway(self, name: str) -> str:
        port = free_port()
        env = {"SIE_NATS_URL": self.nats.url, "SIE_GATEWAY_STATIC_QUEUE_POOLS": "batch"}
        args = ["--host", "127.0.0.1", "--port", str(port), *HEALTH]
        self.processes.append(RoleProcess("gateway", args, env, self.root / f"gateway-{name}.log"))
        return f"http://127.0.0.1:{port}"

    def _worker(self, worker_id: str, args: list[str], worker_env: dict, lane_env: dict | None = None) -> None:
        socket = {"SIE_IPC_SOCKET_PATH": str(self.root / f"{worker_id}.sock")}
        self.processes.append(
            RoleProcess("worker", args, {**socket, **worker_env}, self.root / f"{worker_id}-worker.log")
        )
        sidecar_env = {
            **socket, **(lane_env or {}), "SIE_WORKER_ID": worker_id, "SIE_NATS_URL": self.nats.url,
            "SIE_GATEWAY_URL": self.a, "SIE_POOL_POLL_INTERVAL_S": "0.3", "SIE_NAK_DELAY_S": "0.05",
        }  # fmt: skip
        port = free_port()
        self.probes[worker_id] = f"http://127.0.0.1:{port}"
        args = ["--host", "127.0.0.1", "--port", str(port), *HEALTH]
        self.processes.append(RoleProcess("sidecar", args, sidecar_env, self.root / f"{worker_id}-sidecar.log"))

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()}" for p in self.processes)

    def wait_ready(self) -> None:
        def three_workers(url: str) -> bool:
            try:
                health = httpx.get(f"{url}/health", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return False
            return sum(1 for worker in health["workers"] if worker["healthy"]) == 3

        for url in (self.a, self.b):
            assert holds_within(lambda url=url: three_workers(url), 120), self.logs()

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.nats.stop()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    running = Deployment(tmp_path_factory.mktemp("pools"))
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def pool_names(url: str) -> list[str]:
    return [pool["spec"]["name"] for pool in httpx.get(f"{url}/v1/pools", timeout=5).json()["pools"]]


def test_two_gateways_share_the_pool_store(deployment: Deployment) -> None:
    created = httpx.post(f"{deployment.a}/v1/pools", json={"name": "shared", "gpus": {"default": 1}}, timeout=10)
    assert created.status_code == 201, created.text
    assert httpx.get(f"{deployment.b}/v1/pools/shared", timeout=5).status_code == 200  # read through at once
    assert holds_within(lambda: "shared" in pool_names(deployment.b), 5)
    served = httpx.post(f"{deployment.b}{ENCODE}", json=TEXT, headers={"X-SIE-Pool": "shared"}, timeout=30)
    assert served.status_code == 200, served.text
    assert httpx.delete(f"{deployment.b}/v1/pools/shared", timeout=5).json() == {"deleted": "shared"}
    assert holds_within(lambda: "shared" not in pool_names(deployment.a), 5)
    gone = httpx.post(f"{deployment.a}{ENCODE}", json=TEXT, headers={"X-SIE-Pool": "shared"}, timeout=30)
    assert gone.status_code == 404 and gone.json()["detail"]["code"] == "POOL_NOT_FOUND"


def test_a_lease_expires_unless_renewed(deployment: Deployment) -> None:
    body = {"name": "brief", "gpus": {"default": 1}, "ttl_seconds": 2}
    first = httpx.post(f"{deployment.a}/v1/pools", json=body, timeout=10).json()
    renewed = httpx.post(f"{deployment.b}/v1/pools/brief/renew", timeout=10)
    assert renewed.status_code == 200 and renewed.json()["status"]["expires_at"] > first["status"]["expires_at"]
    assert holds_within(lambda: httpx.get(f"{deployment.a}/v1/pools/brief", timeout=5).status_code == 404, 10)
    assert "brief" not in pool_names(deployment.b) or holds_within(lambda: "brief" not in pool_names(deployment.b), 5)
    refused = httpx.post(f"{deployment.b}{ENCODE}", json=TEXT, headers={"X-SIE-Pool": "brief"}, timeout=30)
    assert refused.status_code == 404


def pools_requests(gateway: str) -> float:
    """`/v1/pools` requests the gateway answered 200 (the sidecars' polls among them), from its /metrics."""
    text = httpx.get(f"{gateway}/metrics", timeout=5).text
    lines = [line for line in text.splitlines() if line.startswith("sie_gateway_requests_total{")]
    ours = [line for line in lines if 'route="/v1/pools"' in line and 'status="200"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in ours)


def pool_refusals(probe: str) -> float:
    """Work items a sidecar NAKed for its pool admission so far, from its /metrics (0 before the first)."""
    text = httpx.get(f"{probe}/metrics", timeout=5).text
    refused = 'sie_worker_admission_decisions_total{decision="pool_refused"}'
    lines = [line for line in text.splitlines() if line.startswith(refused)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_capped_pools_work_goes_only_to_its_assigned_worker(deployment: Deployment) -> None:
    body = {"name": "capped", "gpus": {"default": 1}, "gpu_caps": {"default": 1}}
    pool = httpx.post(f"{deployment.a}/v1/pools", json=body, timeout=10).json()
    assigned = [worker["name"] for worker in pool["status"]["assigned_workers"]]
    assert len(assigned) == 1 and assigned[0] in ("w-1", "w-2"), pool
    # Gateway b reads the same assignment, and the sidecars have polled it from gateway a (every 0.3 s): several
    # polls seen since the pool was made, not a fixed sleep, which a loaded machine outlasts.
    polled = pools_requests(deployment.a)
    assert holds_within(
        lambda: [w["name"] for w in httpx.get(f"{deployment.b}/v1/pools/capped", timeout=5).json()["status"][
            "assigned_workers"]] == assigned, 5
    )  # fmt: skip
    assert holds_within(lambda: pools_requests(deployment.a) >= polled + 8, 15)

    async def send(url: str, headers: dict[str, str], count: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{url}{ENCODE}", json=TEXT, headers=headers)
                                          for _ in range(count)))  # fmt: skip

    # Counted from here: an earlier test's request for a pool made a moment before may have been NAKed once by a
    # sidecar whose view did not list that pool yet (refused as unknown, then redelivered), which is not this one's.
    refusals_before = {name: pool_refusals(probe) for name, probe in deployment.probes.items()}
    capped = asyncio.run(send(deployment.b, {"X-SIE-Pool": "capped"}, 40))
    assert [r.status_code for r in capped] == [200] * 40, [r.text for r in capped if r.status_code != 200][:2]
    assert {r.headers["x-sie-worker"] for r in capped} == set(assigned)
    # Sent on the assigned worker's own subject (seed 000 §8.2): no sidecar had to refuse (NAK) any of it.
    assert {name: pool_refusals(probe) for name, probe in deployment.probes.items()} == refusals_before
    # The other worker is live and takes ordinary work from the same queue. One wave of 40 can fit in one sidecar's
    # fetch (the first to ask takes it whole), so up to five waves are sent until both workers have answered.
    answered_by: set[str] = set()
    for _ in range(5):
        plain = asyncio.run(send(deployment.a, {}, 40))
        assert [r.status_code for r in plain] == [200] * 40
        answered_by |= {r.headers["x-sie-worker"] for r in plain}
        if answered_by == {"w-1", "w-2"}:
            break
    assert answered_by == {"w-1", "w-2"}
    httpx.delete(f"{deployment.a}/v1/pools/capped", timeout=5)


def test_a_pools_pinned_model_is_loaded_on_its_assigned_worker_without_a_request(deployment: Deployment) -> None:
    # The sidecar of each worker the pool assigns has it load the pinned model and keep it loaded;
    # the gateway's series and its model listing follow from the workers' heartbeats. Nothing asks for the model.
    body = {"name": "pinning", "gpus": {"default": 1}, "gpu_caps": {"default": 1}, "pinned_models": [PINNED]}
    created = httpx.post(f"{deployment.a}/v1/pools", json=body, timeout=10)
    assert created.status_code == 201, created.text
    try:
        assigned = {worker["name"] for worker in created.json()["status"]["assigned_workers"]}
        series = f'sie_gateway_pool_pinned_model_loaded{{model="{PINNED}",pool="pinning"}} 1.0'
        assert holds_within(lambda: series in httpx.get(f"{deployment.a}/metrics", timeout=5).text, 30), (
            deployment.logs()
        )

        def holding() -> set[str]:
            workers = httpx.get(f"{deployment.a}/health", timeout=5).json()["workers"]
            return {worker["name"] for worker in workers if PINNED in worker["loaded_models"]}

        assert holds_within(lambda: assigned <= holding(), 10)
        models = {model["name"]: model for model in httpx.get(f"{deployment.a}/health", timeout=5).json()["models"]}
        assert models[PINNED]["worker_count"] >= 1
        listed = httpx.get(f"{deployment.a}/v1/models/{PINNED}", timeout=5).json()
        assert listed["pinned_by"] == ["pinning"] and listed["state"] == "loaded"
    finally:
        httpx.delete(f"{deployment.a}/v1/pools/pinning", timeout=5)


def test_an_unknown_pool_is_404_and_makes_no_stream(deployment: Deployment) -> None:
    for url in (deployment.a, deployment.b):
        response = httpx.post(f"{url}{ENCODE}", json=TEXT, headers={"X-SIE-MACHINE-PROFILE": "nobody/default"})
        assert response.status_code == 404 and response.json()["detail"]["code"] == "POOL_NOT_FOUND"

    async def stream_exists() -> bool:
        broker = await nats.connect(deployment.nats.url)
        try:
            await broker.jetstream().stream_info(work_pool_stream_name("nobody"))
            return True
        except NotFoundError:
            return False
        finally:
            await broker.close()

    assert asyncio.run(stream_exists()) is False


def test_a_cold_lane_records_demand_for_the_autoscaler(deployment: Deployment) -> None:
    httpx.post(f"{deployment.a}/v1/pools", json={"name": "gpu", "gpus": {"l4": 2}, "minimum_worker_count": 1})
    cold = httpx.post(f"{deployment.b}{ENCODE}", json=TEXT, headers={"X-SIE-Pool": "gpu"}, timeout=30)
    assert cold.status_code == 503 and cold.headers["x-sie-error-code"] == "PROVISIONING", cold.text
    lane = httpx.get(f"{deployment.b}/v1/scaling/lanes/default/l4/default", timeout=5).json()
    assert lane["pending_demand"] == 1 and lane["workers"] == 0
    assert holds_within(
        lambda: httpx.get(f"{deployment.a}/v1/scaling/lanes/default/l4/default", timeout=5).json()["warm_floor"] == 1, 5
    )
    metrics = httpx.get(f"{deployment.b}/metrics", timeout=5).text
    assert 'sie_gateway_lane_pending_demand{bundle="default",machine_profile="l4",pool="default"} 1.0' in metrics
    httpx.delete(f"{deployment.a}/v1/pools/gpu", timeout=5)


def test_a_worker_holding_another_config_is_not_auto_routed(deployment: Deployment) -> None:
    health = httpx.get(f"{deployment.a}/health", timeout=5).json()
    stale = next(worker for worker in health["workers"] if worker["name"] == "w-stale")
    assert stale["healthy"] and stale["machine_profile"] == "stale"
    status = httpx.get(f"{deployment.a}/v1/configs/models/{MINILM}/status", timeout=5).json()
    assert "w-stale" in status["bundles"][0]["pending_workers"]  # its hash is not the expected one
    response = httpx.post(f"{deployment.a}{ENCODE}", json=TEXT, headers={"X-SIE-MACHINE-PROFILE": "stale"}, timeout=30)
    assert response.status_code == 503 and response.headers["x-sie-error-code"] == "PROVISIONING", response.text
