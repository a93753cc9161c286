"""Fixtures of the fault scenarios (issue 13 §4): one distributed cluster of real processes for the module
(scripts/reliability/faults.py, shared with report.py) and the reference vector of every client text."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "reliability"))
from faults import fault_cluster  # noqa: E402
from load import LoadOptions, References, make_texts  # noqa: E402

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
