"""Who this process is: its role, the ids it shows on the bus, and the physical lane it serves.

Lane names follow seed 000 §16.3 (trimmed, lowercased, [A-Za-z0-9_-]); ids follow contracts A §2.1 and §2.4.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import attrs

from sie.settings._parsers import choice, name_token, seconds, text
from sie.settings._spec import ROLES, Env, setting


def _router_id(environ: Mapping[str, str]) -> str:
    # sie-config and the gateway both use "{hostname}-{pid}", the host taken from POD_NAME or HOSTNAME.
    host = (environ.get("POD_NAME") or "").strip() or (environ.get("HOSTNAME") or "").strip()
    return f"{host or socket.gethostname()}-{os.getpid()}"


@attrs.frozen
class ProcessSettings:
    """What this process runs and how it names itself to the other processes."""

    role: str = setting(
        Env(
            "SIE_ROLE",
            choice(*ROLES),
            "Which role this process runs; `all` runs gateway, sidecar and worker in one process with no NATS.",
            roles=ROLES,
            read_by=("sie.cli.run",),
        ),
        "all",
    )
    worker_id: str = setting(
        Env(
            "SIE_WORKER_ID",
            text(),
            "Worker identity in heartbeats, Ping and results (`sie.health.{worker_id}`).",
            aliases=("HOSTNAME",),
            roles=("sidecar", "worker", "all"),
            read_by=("sie.roles.sidecar", "sie.roles.worker", "sie.roles.local_workers"),
        ),
        "worker-unknown",
    )
    router_id: str = setting(
        Env(
            "SIE_ROUTER_ID",
            text(),
            "Id of a gateway (`_INBOX.{router_id}.>`) or config service (the producer id gateways trust).",
            shown_default="`{POD_NAME or HOSTNAME}-{pid}`",
            roles=("gateway", "config", "all"),
            read_by=("sie.roles.gateway", "sie.roles.config", "sie.roles.all"),
        ),
        factory=_router_id,
    )
    deployment_env: str = setting(
        Env(
            "SIE_DEPLOYMENT_ENV",
            text(),
            "Deployment environment; `prod` with no tokens makes the config service refuse every request.",
            aliases=("SIE_ENV",),
            roles=("config",),
            read_by=("sie.roles.config",),
        ),
        "unknown",
    )
    event_loop: str = setting(
        Env(
            "SIE_EVENT_LOOP",
            choice("auto", "uvloop", "asyncio"),
            "The process's event loop: `uvloop` (libuv, less CPU per request), `asyncio` (the standard "
            "library's), or `auto`: uvloop when it is installed, else asyncio.",
            roles=ROLES,
            read_by=("sie.roles.serving",),
        ),
        "auto",
    )
    malloc_huge_pages: str = setting(
        Env(
            "SIE_MALLOC_HUGE_PAGES",
            choice("auto", "on", "off"),
            "On Linux with glibc: whether malloc backs its large blocks with transparent huge pages "
            "(`glibc.malloc.hugetlb=1`, added to GLIBC_TUNABLES by re-executing `sie run` once as it starts; "
            "worker processes it spawns inherit it). `auto`: in the `worker` role only. onnxruntime allocates a "
            "run's activations as one block, which glibc maps and unmaps at every run: in 4 KiB pages that is tens "
            "of thousands of page faults a batch (an 8-layer decoder embedder at 32 x 128 tokens: 28,000 faults and "
            "3 % of its run; 81 with huge pages). `on` in `--role all`, measured with scripts/bench/memory.py (20 MB "
            "bodies): those requests 3-30 % faster and the peak 50-130 MiB lower, for 17-42 MiB more held after "
            "them (2 MiB pages give back less finely). Not the default there: with the kernel's THP defrag in "
            "`madvise` mode a page fault may wait for memory compaction, a pause the HTTP side of the process would "
            "see. Needs transparent huge pages in `madvise` or `always` mode; otherwise, or off, malloc runs as it "
            "would. An operator's own `glibc.malloc.hugetlb` in GLIBC_TUNABLES is kept.",
            roles=ROLES,
            read_by=("sie.cli.run",),
        ),
        "auto",
    )
    http_server: str = setting(
        Env(
            "SIE_HTTP_SERVER",
            choice("hypercorn", "uvicorn"),
            "The HTTP server of the gateway and config roles. Both serve HTTP/1.1 and h2c (HTTP/2 without TLS, "
            "by prior knowledge or a first request's `Upgrade: h2c`) on one bind. `uvicorn`: HTTP/1.1 through "
            "the httptools parser, about a fifth of hypercorn's CPU per request (more of a small machine left to "
            "the model); a connection that asks for HTTP/2 is handed to hypercorn's HTTP/2 stack. `hypercorn`: "
            "every connection in hypercorn (pure-Python HTTP/1.1).",
            roles=("gateway", "config", "all"),
            read_by=("sie.roles.serving",),
        ),
        "uvicorn",
    )
    shutdown_grace_s: float = setting(
        Env(
            "SIE_SHUTDOWN_GRACE_S",
            seconds(),
            "On SIGTERM, how long in-flight work may finish before the process exits (a multi-device worker: how "
            "long its children may take to stop before they are killed).",
            roles=("gateway", "config", "sidecar", "worker", "all"),
            read_by=(
                "sie.roles.serving",
                "sie.roles.sidecar",
                "sie.roles.all",
                "sie.roles.gateway",
                "sie.roles.worker",
            ),
        ),
        20.0,
    )


# Every role but the config service serves or routes to one lane.
_LANE_ROLES = ("gateway", "sidecar", "worker", "all")
_LANE_READERS = ("sie.gateway.router", "sie.sidecar.sidecar", "sie.sidecar.pod.health")


@attrs.frozen
class LaneSettings:
    """The lane `sie.work.{pool}.{machine_profile}.{bundle}.*` that a sidecar consumes and a worker serves;
    a gateway routes requests that name no lane to it."""

    pool: str = setting(
        Env(
            "SIE_POOL",
            name_token(),
            "Physical queue pool; selects the stream `WORK_POOL_{pool}`.",
            roles=_LANE_ROLES,
            read_by=(*_LANE_READERS, "sie.worker.service"),
        ),
        "default",
    )
    machine_profile: str = setting(
        Env(
            "SIE_MACHINE_PROFILE",
            name_token(),
            "Machine profile (GPU type) of this worker's lane.",
            roles=_LANE_ROLES,
            read_by=_LANE_READERS,
        ),
        "default",
    )
    bundle: str = setting(
        Env(
            "SIE_BUNDLE",
            name_token(),
            "Bundle this worker serves; scopes its `bundle_config_hash` and config deltas.",
            roles=_LANE_ROLES,
            read_by=("sie.sidecar.sidecar", "sie.sidecar.pod.health", "sie.worker.service"),
        ),
        "default",
    )
