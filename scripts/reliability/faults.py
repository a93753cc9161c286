"""The fault scenarios of issue 13 §4 on real processes: a distributed cluster (nats-server with JetStream file
storage, `sie run --role worker|sidecar|gateway`, all-MiniLM-L6-v2) whose parts are killed and started again
while `load.Load` clients check every answer. Shared by `report.py` and `tests/fault/`.

Scenarios: `none` (the load alone, for comparison), `worker`, `sidecar`, `gateway` (kill -9, started again
RESTART_DELAY_S later), `nats` (the broker stopped and started again on the same port and store), `nats_down` (the
roles start while the broker is down, the load begins once gateway and sidecar listen, the broker comes up
`fault_at_s` into it). Each returns one `Tally`; recovery counts from the fault (the kill, the stop, or the broker's
start).

The three-node scenarios (issue 33) run on a JetStream cluster of three nats-servers with every stream and bucket
replicated three times (SIE_STREAM_REPLICAS=3), the gateway and sidecar given all three URLs: `nats_leader` (kill -9
the node leading the work stream, started again RESTART_DELAY_S later), `nats_follower` (the same for a node that
does not lead it), `nats_gateway_node` (the same for the node the gateway is connected to, so it reconnects to
another while results are on their way), `nats_rolling` (every node stopped and started again in turn, each once the
work stream is current again: a rolling upgrade).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from load import MODEL, Load, LoadOptions, References, Tally, make_texts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher import Cluster  # noqa: E402

SCENARIOS = (
    "none", "worker", "sidecar", "nats", "gateway", "nats_down",
    "nats_leader", "nats_follower", "nats_gateway_node", "nats_rolling",
)  # fmt: skip
CLUSTER_SCENARIOS = frozenset({"nats_leader", "nats_follower", "nats_gateway_node", "nats_rolling"})
CLUSTER_NODES = 3
# The stream the load needs current before a rolling restart takes the next node down.
WORK_STREAMS = ("WORK_POOL_default",)
# A killed role is started again this long after the kill (the goal: restarted within 5 s).
RESTART_DELAY_S = 2.0
# Each call's budget equals the gateway's request timeout: a call survives a fault only if its work is redelivered
# (or refused and retried) promptly.
GATEWAY_TIMEOUT_S = 30.0


def fault_cluster(directory: Path, *, broker_up: bool = True, nats_nodes: int = 1) -> Cluster:
    """The deployment the scenarios hurt: the launcher's cluster with the broker storing streams on disk (so a
    restarted nats-server finds the work it held), `nats_nodes` of them replicating every stream that many times, and
    the gateway's request timeout at GATEWAY_TIMEOUT_S."""
    broker = {"SIE_STREAM_STORAGE": "file", "SIE_STREAM_REPLICAS": str(nats_nodes)}
    return Cluster(
        directory,
        model=MODEL,
        broker_env=broker,
        gateway_timeout_s=GATEWAY_TIMEOUT_S,
        broker_up=broker_up,
        nats_nodes=nats_nodes,
    )


def scenario_cluster(directory: Path, scenario: str) -> Cluster:
    """The deployment `scenario` runs on: three broker nodes for the cluster scenarios, else one."""
    nodes = CLUSTER_NODES if scenario in CLUSTER_SCENARIOS else 1
    return fault_cluster(directory, broker_up=scenario != "nats_down", nats_nodes=nodes)


async def inject(cluster: Cluster, scenario: str) -> float:
    """Cause `scenario`'s fault and undo it (`nats_down`: start the broker); returns the monotonic time of the
    fault. Process control runs in a thread: the clients share this event loop."""
    fault_at = time.monotonic()
    if scenario == "none":
        return fault_at
    if scenario in CLUSTER_SCENARIOS:
        await _hurt_cluster(cluster, scenario)
        return fault_at
    if scenario == "nats":
        await asyncio.to_thread(cluster.stop, "nats")
    elif scenario != "nats_down":
        await asyncio.to_thread(cluster.kill, scenario)
        await asyncio.sleep(RESTART_DELAY_S)
    await asyncio.to_thread(cluster.start, "nats" if scenario.startswith("nats") else scenario)
    return fault_at


async def _hurt_cluster(cluster: Cluster, scenario: str) -> None:
    brokers = cluster.brokers
    if scenario == "nats_rolling":
        for index in brokers.indexes:
            await asyncio.to_thread(cluster.stop, f"nats-{index}")
            await asyncio.to_thread(cluster.start, f"nats-{index}")
            await asyncio.to_thread(brokers.wait_current, WORK_STREAMS)
        return
    if scenario == "nats_gateway_node":
        node = await asyncio.to_thread(brokers.node_serving, "sie-gateway-")
        if node is None:
            raise RuntimeError("no NATS node has the gateway's connection")
    else:
        leader = await asyncio.to_thread(brokers.stream_leader, WORK_STREAMS[0])
        if leader is None:
            raise RuntimeError(f"{WORK_STREAMS[0]} has no leader to choose the node by")
        node = leader if scenario == "nats_leader" else next(index for index in brokers.indexes if index != leader)
    await asyncio.to_thread(cluster.kill, f"nats-{node}")
    await asyncio.sleep(RESTART_DELAY_S)
    await asyncio.to_thread(cluster.start, f"nats-{node}")


async def run_scenario(cluster: Cluster, scenario: str, references: References, options: LoadOptions) -> Tally:
    """Load the cluster, cause the fault `options.fault_at_s` after every client's first call ended, keep
    loading to `options.duration_s` from then (with `options.settle_s`: until that long after the first call sent
    once the fault was undone is answered), let every call end and count how they did."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {', '.join(SCENARIOS)}")
    if scenario == "nats_down":  # the roles have started without a broker: that is the fault
        await asyncio.to_thread(cluster.wait_listening)
    load = Load(cluster.url, references, options)
    load.start()
    try:
        if scenario != "nats_down":  # with no broker no call ends before the fault
            await load.warmed_up()
        started = time.monotonic()
        await asyncio.sleep(options.fault_at_s)
        fault_at = await inject(cluster, scenario)
        await load.last_until_settled(started, undone_at=time.monotonic())
    finally:
        await load.stop()
    return load.tally(scenario, fault_at)


async def reference_cluster(directory: Path, options: LoadOptions) -> References:
    """References for `options`' texts, from a cluster started for the purpose (then stopped)."""
    cluster = fault_cluster(directory)
    try:
        await asyncio.to_thread(cluster.wait_serving)
        return await References.compute(cluster.url, make_texts(options.text_count))
    finally:
        await asyncio.to_thread(cluster.close)
