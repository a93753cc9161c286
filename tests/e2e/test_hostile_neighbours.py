"""Hostile requests among innocent ones, against a real `sie run --role all` and a real distributed deployment
(nats-server, worker, sidecar, gateway): 0 innocent failures, every hostile request a clean 400 (issue 14 §1).

The issue's reproduction was a template that is no string sent among good requests: it failed 10 of 150 innocent
requests in `all` and 17 of 90 in distributed mode with a 504 after 30 s, and was redelivered for minutes.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from support.cluster import Cluster
from support.hostile import HOSTILE, hostile_misanswers, innocent_failures, references, send_crowd

pytestmark = pytest.mark.slow


def assert_no_hostile_neighbour_hurts(base_url: str, innocent: int) -> None:
    with httpx.Client(base_url=base_url, timeout=120.0) as client:
        expected = references(client)
    outcomes = send_crowd(base_url, innocent=innocent, rounds_of_hostile=2)
    assert len(outcomes) == innocent + 2 * len(HOSTILE)
    assert innocent_failures(outcomes, expected) == []
    assert hostile_misanswers(outcomes) == []


def test_hostile_requests_fail_alone_in_the_all_role(all_server: str) -> None:
    assert_no_hostile_neighbour_hurts(all_server, innocent=150)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    deployment = Cluster(tmp_path_factory.mktemp("hostile-neighbours"))
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.stop()


def test_hostile_requests_fail_alone_in_distributed_mode(cluster: Cluster) -> None:
    assert_no_hostile_neighbour_hurts(cluster.url, innocent=90)
