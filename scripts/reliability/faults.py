"""The fault scenarios of issue 13 §4 on real processes: a distributed cluster (nats-server with JetStream file
storage, `sie run --role worker|sidecar|gateway`, all-MiniLM-L6-v2) whose parts are killed and started again
while `load.Load` clients check every answer. Shared by `report.py` and `tests/fault/`.

Scenarios: `none` (the load alone, for comparison), `worker`, `sidecar`, `gateway` (kill -9, started again
RESTART_DELAY_S later), `nats` (the broker stopped and started again on the same port and store), `nats_down` (the
roles start while the broker is down, the load begins once gateway and sidecar listen, the broker comes up
`fault_at_s` into it). Each returns one `Tally`; recovery counts from the fault (the kill, the stop, or the broker's
start).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from load import MODEL, Load, LoadOptions, References, Tally, make_texts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher import Cluster  # noqa: E402

SCENARIOS = ("none", "worker", "sidecar", "nats", "gateway", "nats_down")
# A killed role is started again this long after the kill (the goal: restarted within 5 s).
RESTART_DELAY_S = 2.0
# Each call's budget equals the gateway's request timeout: a call survives a fault only if its work is redelivered
# (or refused and retried) promptly.
GATEWAY_TIMEOUT_S = 30.0


def fault_cluster(directory: Path, *, broker_up: bool = True) -> Cluster:
    """The deployment the scenarios hurt: the launcher's cluster with the broker storing streams on disk (so a
    restarted nats-server finds the work it held) and the gateway's request timeout at GATEWAY_TIMEOUT_S."""
    broker = {"SIE_STREAM_STORAGE": "file"}
    return Cluster(directory, model=MODEL, broker_env=broker, gateway_timeout_s=GATEWAY_TIMEOUT_S, broker_up=broker_up)


async def inject(cluster: Cluster, scenario: str) -> float:
    """Cause `scenario`'s fault and undo it (`nats_down`: start the broker); returns the monotonic time of the
    fault. Process control runs in a thread: the clients share this event loop."""
    fault_at = time.monotonic()
    if scenario == "none":
        return fault_at
    if scenario == "nats":
        await asyncio.to_thread(cluster.stop, "nats")
    elif scenario != "nats_down":
        await asyncio.to_thread(cluster.kill, scenario)
        await asyncio.sleep(RESTART_DELAY_S)
    await asyncio.to_thread(cluster.start, "nats" if scenario.startswith("nats") else scenario)
    return fault_at


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
