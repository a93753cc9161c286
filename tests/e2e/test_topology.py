"""Many gateways and many sidecars on one lane (issue 33): two gateways and four sidecar + worker pairs (the null
backend, so the transport is what is measured) on one nats-server, as real processes, and a fifth pair running the
real MiniLM on a lane of its own (machine profile `real`). Clients on both gateways at once: every request is
answered by the gateway it was sent to with one result per item (a result that went to the other gateway would leave
its request waiting: no 200), and the real lane answers both gateways with the model's vectors; a sidecar removed
under load, and added again, loses nothing; a gateway killed loses only the requests sent to it. Marked slow."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import numpy as np
import pytest

from launcher import Cluster, holds_within

pytestmark = pytest.mark.slow

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
PATH = f"/v1/encode/{MODEL}"
PAIRS, GATEWAYS = 4, 2  # null pairs; pair PAIRS + 1 runs the real model on machine profile REAL
REAL = "real"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]
CLIENTS_PER_GATEWAY = 12
REQUEST_TIMEOUT_S = 20.0


@attrs.define
class Tally:
    """What one gateway's clients saw: answered (200 with one result per item), failed (any other answer, or a wrong
    item count), unreachable (no answer: connection refused or cut)."""

    answered: int = 0
    failed: int = 0
    unreachable: int = 0
    reasons: list[str] = attrs.field(factory=list)


class Load:
    """`CLIENTS_PER_GATEWAY` closed-loop clients per gateway, each request 1-4 texts, until `stop()`."""

    def __init__(self, urls: list[str]) -> None:
        self.tallies = {url: Tally() for url in urls}
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._counter = itertools.count()

    async def __aenter__(self) -> Load:
        limits = httpx.Limits(max_connections=CLIENTS_PER_GATEWAY * len(self.tallies))
        self._client = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits)
        for url in self.tallies:
            self._tasks += [asyncio.create_task(self._client_loop(url)) for _ in range(CLIENTS_PER_GATEWAY)]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stopping.set()
        await asyncio.gather(*self._tasks)
        await self._client.aclose()

    async def running_for(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _client_loop(self, url: str) -> None:
        tally = self.tallies[url]
        rng = random.Random(next(self._counter))
        while not self._stopping.is_set():
            count = rng.randint(1, 4)
            body = {"items": [{"text": f"text {next(self._counter)}"} for _ in range(count)]}
            try:
                response = await self._client.post(f"{url}{PATH}", json=body)
            except httpx.TransportError as exc:
                tally.unreachable += 1
                tally.reasons.append(type(exc).__name__)
                await asyncio.sleep(0.05)  # a gateway that is gone refuses at once: do not spin
                continue
            if response.status_code == 200 and len(response.json()["items"]) == count:
                tally.answered += 1
            else:
                tally.failed += 1
                tally.reasons.append(f"{response.status_code} {response.text[:200]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root: Path = tmp_path_factory.mktemp("topology")
    real = PAIRS + 1
    deployment = Cluster(
        root, ["--backend", "null"], model=MODEL, pairs=real, gateways=GATEWAYS,
        pair_args={real: ["--preload", MODEL]}, pair_env={real: {"SIE_MACHINE_PROFILE": REAL}},
    )  # fmt: skip
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.close()


def _run(cluster: Cluster, seconds: float, during=None) -> dict[str, Tally]:
    """Load both gateways for `seconds`; `during()` (in a thread) runs one second into it."""

    async def main() -> dict[str, Tally]:
        async with Load(cluster.urls) as load:
            await load.running_for(1.0)
            if during is not None:
                await asyncio.to_thread(during)
            await load.running_for(seconds)
        return load.tallies

    return asyncio.run(main())


def _clean(tally: Tally, cluster: Cluster) -> None:
    assert tally.answered > 0, f"{tally}; logs in {cluster.root}"
    assert (tally.failed, tally.unreachable) == (0, 0), f"{tally.reasons[:5]}; logs in {cluster.root}"


def test_every_request_is_answered_by_the_gateway_it_was_sent_to(cluster: Cluster) -> None:
    for tally in _run(cluster, 2.0).values():
        _clean(tally, cluster)


def test_the_real_model_lane_answers_both_gateways_with_its_vectors(cluster: Cluster) -> None:
    body, headers = {"items": [{"text": "Hello world"}]}, {"X-SIE-MACHINE-PROFILE": REAL}

    def answers(url: str) -> httpx.Response | None:
        response = httpx.post(f"{url}{PATH}", json=body, headers=headers, timeout=30)
        return response if response.status_code == 200 else None

    for url in cluster.urls:
        assert holds_within(lambda url=url: answers(url), 60), cluster.logs()  # its first heartbeats reach both
        response = answers(url)
        assert response is not None and response.headers["x-sie-worker"] == f"w-{PAIRS + 1}"
        values = response.json()["items"][0]["dense"]["values"]
        assert len(values) == 384 and np.allclose(values[:4], HELLO_WORLD_PREFIX, atol=1e-5)


def test_a_sidecar_removed_and_added_again_under_load_loses_nothing(cluster: Cluster) -> None:
    def remove() -> None:
        cluster.stop("sidecar-4")  # SIGTERM: it drains, handing back what it has not run
        cluster.stop("worker-4")

    for tally in _run(cluster, 2.0, remove).values():
        _clean(tally, cluster)

    def add() -> None:
        cluster.start("worker-4")
        cluster.start("sidecar-4")

    for tally in _run(cluster, 2.5, add).values():
        _clean(tally, cluster)


def test_a_gateway_killed_loses_only_the_requests_sent_to_it(cluster: Cluster) -> None:
    survivor, killed = cluster.urls
    try:
        tallies = _run(cluster, 2.0, lambda: cluster.kill("gateway-2"))
    finally:
        cluster.start("gateway-2")
    _clean(tallies[survivor], cluster)
    lost = tallies[killed]
    assert lost.unreachable > 0 and lost.answered > 0, lost  # it answered until killed, then refused
    cluster.wait_serving()
