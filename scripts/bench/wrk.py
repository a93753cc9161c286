"""HTTP load with `wrk` (Debian package): a C load generator that costs about 1 % of a core, so on a 2-core
machine the server being measured keeps its CPU (a Python generator takes a third of it and flattens differences).

`run_wrk` sends POST requests rotating through pre-built JSON bodies on keep-alive connections for a number of
seconds and returns what wrk counted: requests, non-2xx answers, socket errors and latency percentiles. The request
bytes are formatted once per wrk thread (`init`), so wrk does no per-request Lua work but picking the next one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs

_SCRIPT = """
local bodies = {%(bodies)s}
local prepared = {}
local next_index = 0

function init(args)
  local headers = {["Content-Type"] = "application/json", ["Accept"] = "application/json"}
  for i, body in ipairs(bodies) do
    prepared[i] = wrk.format("POST", "%(path)s", headers, body)
  end
end

function request()
  next_index = next_index %% #prepared + 1
  return prepared[next_index]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK-RESULT {"requests": %%d, "duration_us": %%d, "status_errors": %%d, "socket_errors": %%d, ' ..
    '"p50_us": %%d, "p95_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""


@attrs.frozen
class WrkStats:
    """One wrk run: `requests` answered (any status), of which `status_errors` not 2xx/3xx; latencies in seconds."""

    requests: int
    duration_s: float
    status_errors: int
    socket_errors: int
    p50_s: float
    p95_s: float
    p99_s: float
    items_per_request: int

    @property
    def failures(self) -> int:
        return self.status_errors + self.socket_errors

    @property
    def items_per_second(self) -> float:
        return (self.requests - self.status_errors) * self.items_per_request / self.duration_s


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise SystemExit("wrk is not installed: `apt-get install wrk` (Debian), or `make bench-tools`")
    return found


def _lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def run_wrk(
    url: str, path: str, bodies: list[bytes], connections: int, seconds: int, items_per_request: int
) -> WrkStats:
    """`connections` keep-alive connections on one wrk thread send the `bodies` in turn to `url + path` for
    `seconds` (whole seconds: wrk's resolution)."""
    script = _SCRIPT % {"bodies": ", ".join(_lua_string(body.decode()) for body in bodies), "path": path}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as file:
        file.write(script)
    try:
        command = [wrk_binary(), "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", file.name, url]
        finished = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    finally:
        Path(file.name).unlink()
    line = next((ln for ln in finished.stdout.splitlines() if ln.startswith("WRK-RESULT ")), None)
    if finished.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({finished.returncode}): {finished.stdout}\n{finished.stderr}")
    result = json.loads(line.removeprefix("WRK-RESULT "))
    return WrkStats(
        requests=result["requests"],
        duration_s=result["duration_us"] / 1e6,
        status_errors=result["status_errors"],
        socket_errors=result["socket_errors"],
        p50_s=result["p50_us"] / 1e6,
        p95_s=result["p95_us"] / 1e6,
        p99_s=result["p99_us"] / 1e6,
        items_per_request=items_per_request,
    )
