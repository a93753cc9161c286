"""Memory of `sie run --role all` under big requests (issue 13 §1): resident memory idle, after each request,
its peak (VmHWM) and what is held afterwards, read from /proc of the server process.

    .venv/bin/python scripts/bench/memory.py [--items 200] [--chars 99000] [--score-docs 64]

Requests, in order: /v1/encode, /v1/extract (rampart) and /v1/embeddings with `--items` texts of `--chars`
characters each (about 20 MB of JSON by default), then a SPLADE /v1/score with `--score-docs` documents of
1.5 KB. The server preloads the three models first, so loading them is part of the idle figure. Bounded: every
request has a timeout, the server is stopped at the end; loopback only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from topology import start_all  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "rasyosef/splade-tiny"
RAMPART = "nationaldesignstudio/rampart"
SENTENCE = "The committee reviewed the quarterly numbers and found the results satisfactory overall. "


def memory_mib(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of `pid` in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) // 1024
    return values["VmRSS"], values["VmHWM"]


def requests(items: int, chars: int, score_docs: int) -> list[tuple[str, dict]]:
    text = (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]
    texts = [text[: chars - 6] + f"{index:06d}" for index in range(items)]
    document = (SENTENCE * 20)[:1500]
    documents = [{"text": document + str(index)} for index in range(score_docs)]
    return [
        (f"/v1/encode/{MINILM}", {"items": [{"text": t} for t in texts]}),
        (f"/v1/extract/{RAMPART}", {"items": [{"text": t} for t in texts]}),
        ("/v1/embeddings", {"model": MINILM, "input": texts}),
        (f"/v1/score/{SPLADE}", {"query": {"text": "numbers"}, "items": documents}),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--chars", type=int, default=99_000)
    parser.add_argument("--score-docs", type=int, default=64)
    args = parser.parse_args(argv)
    log = Path(tempfile.mkdtemp(prefix="sie-bench-memory-")) / "all.log"
    process, url = start_all(["--preload", f"{MINILM},{SPLADE},{RAMPART}"], {}, log)
    try:
        httpx.post(f"{url}/v1/encode/{MINILM}", json={"items": [{"text": "warm"}]}, timeout=60)
        idle, _ = memory_mib(process.pid)
        print(f"idle: {idle} MiB resident (three models loaded)")
        print(f"{'request':<48}{'body MB':>9}{'status':>8}{'seconds':>9}{'RSS MiB':>9}{'peak MiB':>10}")
        for route, body in requests(args.items, args.chars, args.score_docs):
            raw = json.dumps(body).encode()
            started = time.monotonic()
            status = httpx.post(url + route, content=raw, headers={"content-type": "application/json"}, timeout=180)
            elapsed = time.monotonic() - started
            time.sleep(2)  # let the request's work settle before reading memory
            now, peak = memory_mib(process.pid)
            label = route if len(route) <= 46 else route[:43] + "..."
            print(f"{label:<48}{len(raw) / 1e6:>9.1f}{status.status_code:>8}{elapsed:>9.1f}{now:>9}{peak:>10}")
        time.sleep(5)
        held, peak = memory_mib(process.pid)
        print(f"afterwards: {held} MiB resident ({held - idle:+d} MiB over idle), peak {peak} MiB")
    finally:
        process.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
