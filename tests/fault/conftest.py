"""Fixtures of the fault scenarios (issue 13 §4): one distributed cluster of real processes for the module
(scripts/reliability/faults.py, shared with report.py) and the reference vector of every client text."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "reliability"))
from faults import WORK_STREAMS, fault_cluster, run_scenario  # noqa: E402
from load import LoadOptions, References, Tally, make_texts  # noqa: E402

from launcher import Cluster  # noqa: E402

# Small enough for 2 shared cores to answer every call in well under its deadline when nothing fails; the
# deadline equals the gateway's request timeout, so a call only survives a fault if its work is redelivered
# (or refused and retried) promptly. The fault comes 1 s after every client's first call ended (closed-loop
# clients always have calls in flight); the load ends 1 s after the first call sent once the fault was undone is
# answered (so calls sent after the recovery are checked too), after 20 s of load at the most.
OPTIONS = LoadOptions(clients=30, duration_s=20.0, fault_at_s=1.0, deadline_s=30.0, settle_s=1.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """nats-server (file storage), worker, sidecar and gateway; each test restarts what it kills."""
    deployment = fault_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.close()


@pytest.fixture(scope="session")
def options() -> LoadOptions:
    return OPTIONS


@pytest.fixture(scope="module")
def references(cluster: Cluster, options: LoadOptions) -> References:
    return asyncio.run(References.compute(cluster.url, make_texts(options.text_count)))


def _assert_survived(tally: Tally, cluster: Cluster) -> None:
    """Calls were in flight when the fault hit, calls sent after it were answered, and every call came back with its
    own text's vector: none failed, none lost."""
    detail = f"{tally}; logs in {cluster.root}"
    assert tally.across > 0, detail
    assert tally.recovery_s is not None, detail
    assert (tally.failed, tally.lost) == (0, 0), detail
    assert tally.verified == tally.sent, detail


@pytest.fixture()
def assert_survived():
    """The check `survived` makes, for a test that runs its scenario on a deployment of its own."""
    return _assert_survived


@pytest.fixture()
def survived(cluster: Cluster, references: References, options: LoadOptions):
    """`survived(scenario)`: run one scenario on the module's cluster once the previous test's restarts have
    settled (the broker's streams current again on every node, the cluster serving), and assert it lost and failed
    nothing."""

    def run(scenario: str) -> Tally:
        cluster.brokers.wait_current(WORK_STREAMS)
        cluster.wait_serving()
        tally = asyncio.run(run_scenario(cluster, scenario, references, options))
        _assert_survived(tally, cluster)
        return tally

    return run
