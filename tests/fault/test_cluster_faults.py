"""A three-node NATS JetStream cluster loses a node without losing work (issue 33): nats-server ×3 routed on
loopback, every stream and the pools bucket replicated three times (SIE_STREAM_REPLICAS=3), gateway and sidecar given
all three URLs. While 30 clients send their own texts through the public SDK, the node leading the work stream is
killed with SIGKILL and started again, then a node that does not lead it, then the node the gateway is connected to,
then every node is restarted in turn (a rolling upgrade). Every call must come back within its 30 s deadline with its
own text's vector: none lost, none failed (the SDK retries the 503s of a leader election). Marked slow; the full load
(300 clients) is `scripts/reliability/report.py --scenario nats_leader nats_follower nats_gateway_node nats_rolling`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from faults import CLUSTER_NODES, WORK_STREAMS, fault_cluster

from launcher import Cluster

pytestmark = pytest.mark.slow

# DEAD_LETTERS is made on the first capture, with the same replicas (tests/unit/test_nats_dead_letters.py).
REPLICATED = (*WORK_STREAMS, "WORK_WORKER_w-1", "KV_SIE_POOLS")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nats-server nodes (file storage), worker, sidecar and gateway; the `references` fixture reads it."""
    deployment = fault_cluster(tmp_path_factory.mktemp("cluster3"), nats_nodes=CLUSTER_NODES)
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.close()


def test_every_stream_and_the_pools_bucket_have_three_current_replicas(cluster: Cluster) -> None:
    cluster.brokers.wait_current(REPLICATED)
    assert cluster.brokers.stream_leader(WORK_STREAMS[0]) in cluster.brokers.indexes


def test_the_work_streams_leader_killed_and_restarted_loses_and_fails_no_call(survived) -> None:
    survived("nats_leader")


def test_a_follower_killed_and_restarted_loses_and_fails_no_call(survived) -> None:
    survived("nats_follower")


def test_the_gateways_node_killed_loses_no_result_sent_while_it_reconnects(survived) -> None:
    survived("nats_gateway_node")


def test_a_rolling_restart_of_every_node_loses_and_fails_no_call(survived) -> None:
    survived("nats_rolling")
