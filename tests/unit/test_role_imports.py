"""What importing a role loads: each `sie run` process pays for its imports at every start (the suite starts about
150 of them, a pod at every restart), so a package only some processes need is imported where it is used. The
all-in-one role never dials NATS, so it loads neither the NATS client nor aiohttp (nats-py's WebSocket transport);
hypercorn loads with the first HTTP/2 connection or SIE_HTTP_SERVER=hypercorn; Jinja with the first model that has
a chat template; fsspec with a payload store or a weights URL (the config store still needs it); protobuf with the
KServe gRPC service (SIE_GATEWAY_GRPC_PORT)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

WATCHED = ("nats", "aiohttp", "hypercorn", "jinja2", "fsspec", "uvicorn", "google.protobuf")

PROBE = """
import json, sys
import sie.roles.{role}
print(json.dumps([name for name in {watched!r} if name in sys.modules]))
"""


def loaded_by(role: str) -> set[str]:
    # A fresh interpreter: this test process has long imported all of them.
    probe = subprocess.run([sys.executable, "-c", PROBE.format(role=role, watched=WATCHED)], capture_output=True,
                           text=True, check=True, timeout=120)  # fmt: skip
    return set(json.loads(probe.stdout))


# The worker's imports are checked in test_worker_imports.py; the sidecar's are the gateway's, as far as these go.
@pytest.mark.parametrize(
    ("role", "expected"), [("all", {"uvicorn", "fsspec"}), ("gateway", {"uvicorn", "nats", "aiohttp"})]
)
def test_a_role_loads_only_what_every_start_of_it_uses(role: str, expected: set[str]) -> None:
    assert loaded_by(role) == expected


def test_hypercorn_is_not_loaded_until_an_h2c_connection_comes() -> None:
    probe = """
import asyncio, json, sys
from sie.http.h2c import H2cHandOff
from sie.http.serving import HttpListener, hypercorn_config
import functools
hand_off = H2cHandOff(lambda *_: None, functools.partial(hypercorn_config, HttpListener("127.0.0.1", 1, 1.0)))
before = "hypercorn" in sys.modules
hand_off.terminate()  # nothing handed off: nothing to tell, and nothing imported for it
print(json.dumps([before, "hypercorn" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [False, False]
