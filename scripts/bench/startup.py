"""Start-up time of the roles: from process start to the first 200 of its `/healthz`, for `gateway`, `config` and
`all` (no model preloaded: the time is the process's own), medians of interleaved rounds. With `--compare-src`, the
same roles of another checkout's `src/` start in the same rounds, so a before/after is measured in one run.

    .venv/bin/python scripts/bench/startup.py [--rounds 5] [--roles gateway config all] [--compare-src ../old/src]

The gateway connects to NATS in the background (none runs here), so its `/healthz` answers as soon as it serves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from launcher import HOST, RoleProcess, free_port  # noqa: E402

ROLES = ("gateway", "config", "all")
POLL_S = 0.005
TIMEOUT_S = 120.0


def start_seconds(role: str, source: Path | None, log: Path) -> float:
    """Seconds from starting `role` (this tree's, or `source`'s) to its `/healthz` answering 200."""
    port = free_port()
    env = {"PYTHONPATH": str(source)} if source is not None else {}
    started = time.perf_counter()
    process = RoleProcess(role, ["--host", HOST, "--port", str(port)], env, log)
    try:
        deadline = started + TIMEOUT_S
        while time.perf_counter() < deadline:
            if process.returncode is not None:
                raise SystemExit(f"{role} exited with {process.returncode}; log in {log}")
            try:
                if httpx.get(f"http://{HOST}:{port}/healthz", timeout=1.0).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)  # polling with a deadline
        raise SystemExit(f"{role} did not answer /healthz within {TIMEOUT_S} s; log in {log}")
    finally:
        process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--roles", nargs="+", choices=ROLES, default=list(ROLES))
    parser.add_argument("--compare-src", type=Path, help="another checkout's src/ directory, measured beside this one")
    args = parser.parse_args()
    sources: dict[str, Path | None] = {"this tree": None}
    if args.compare_src is not None:
        sources["compared"] = args.compare_src.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="sie-bench-startup-"))
    times: dict[tuple[str, str], list[float]] = {(role, name): [] for role in args.roles for name in sources}
    for round_index in range(args.rounds):
        for role in args.roles:
            for name, source in sources.items():
                log = scratch / f"{role}-{name.replace(' ', '-')}-{round_index}.log"
                times[role, name].append(start_seconds(role, source, log))
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr)
    print(f"process start to /healthz 200, median of {args.rounds} interleaved rounds (seconds; logs in {scratch})")
    print(f"{'role':<10}" + "".join(f"{name:>14}" for name in sources) + ("       ratio" if len(sources) > 1 else ""))
    for role in args.roles:
        medians = [statistics.median(times[role, name]) for name in sources]
        ratio = f"{medians[0] / medians[1]:>12.2f}" if len(medians) > 1 else ""
        print(f"{role:<10}" + "".join(f"{median:>14.2f}" for median in medians) + ratio)


if __name__ == "__main__":
    main()
