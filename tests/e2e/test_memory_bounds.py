"""Memory of `sie run --role all` stays bounded under big requests (issue 13 §1): ~20 MB bodies of long texts on
/v1/encode and /v1/extract (/v1/embeddings takes the encode path; 20 of the 200 texts fill the model's sequence,
the others are mostly spaces) and a SPLADE score of 64 long documents keep the process under 1.5 GB resident at its
peak, and it returns to within 200 MB of its idle size afterwards. Read from /proc/{pid}/status (VmRSS now, VmHWM
peak) of the real server process; `scripts/bench/memory.py` prints the same figures request by request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from launcher import RoleProcess, free_port
from support.polling import holds_within

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "rasyosef/splade-tiny"
RAMPART = "nationaldesignstudio/rampart"
SENTENCE = "The committee reviewed the quarterly numbers and found the results satisfactory overall. "
MIB = 1024 * 1024
PEAK_LIMIT = 1536 * MIB
SETTLED_WITHIN = 200 * MIB
# Texts that fill the model's sequence: more than one budget-sized run of each model (see long_texts).
FULL_TEXTS = 20


def memory(pid: int) -> tuple[int, int]:
    """(resident now, peak resident) of `pid` in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def long_texts() -> list[str]:
    """200 texts of 99,000 characters (under the 100,000 per-item cap). The first FULL_TEXTS are words throughout,
    so each fills its model's max_sequence_length; the others are one sentence padded with spaces (about 20
    tokens), so they cost the body, the parsing and every copy of the text their full size but no model time
    that would prove more: a batch of the full ones already runs its model in several runs of the largest size
    SIE_WORKER_RUN_MEMORY_BYTES allows (256 MiB: 18 rows of all-MiniLM-L6-v2 at 256 tokens, 5 of Rampart at 512)."""
    words = (SENTENCE * 1200)[:98_994]
    return [
        f"{words}{index:06d}" if index < FULL_TEXTS else f"{index:06d} {SENTENCE}".ljust(99_000) for index in range(200)
    ]


def big_requests() -> list[tuple[str, bytes]]:
    """About 20 MB of JSON each: the long texts on encode and extract, 64 documents on score."""
    texts = long_texts()
    documents = [{"text": (SENTENCE * 20)[:1500] + str(index)} for index in range(64)]
    bodies = [
        (f"/v1/encode/{MINILM}", {"items": [{"text": t} for t in texts]}),
        (f"/v1/extract/{RAMPART}", {"items": [{"text": t} for t in texts]}),
        (f"/v1/score/{SPLADE}", {"query": {"text": "numbers"}, "items": documents}),
    ]
    return [(route, json.dumps(body).encode()) for route, body in bodies]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RoleProcess, str]]:
    root = tmp_path_factory.mktemp("memory")
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--preload", f"{MINILM},{SPLADE},{RAMPART}"]
    # Two cores are shared with the test runner: give the big requests time to finish rather than a 504.
    process = RoleProcess("all", args, {"SIE_GATEWAY_REQUEST_TIMEOUT": "300"}, root / "server.log")
    try:
        process.wait_http_ready(f"http://127.0.0.1:{port}/readyz", timeout_s=300)
        yield process, f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def test_big_requests_keep_the_all_role_bounded_and_it_settles_back(server: tuple[RoleProcess, str]) -> None:
    process, url = server
    pid = process.process.pid
    with httpx.Client(base_url=url, timeout=360) as client:
        assert client.post(f"/v1/encode/{MINILM}", json={"items": [{"text": "warm"}]}).status_code == 200
        idle, _ = memory(pid)
        for route, body in big_requests():
            assert len(body) < 21_000_000
            response = client.post(route, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 200, (route, response.text[:300])
    _, peak = memory(pid)
    assert peak < PEAK_LIMIT, f"peak {peak / MIB:.0f} MiB (idle {idle / MIB:.0f} MiB)\n{process.log()}"

    def settled() -> bool:
        return memory(pid)[0] - idle < SETTLED_WITHIN

    assert holds_within(settled, 30.0, interval_s=1.0), (
        f"resident {memory(pid)[0] / MIB:.0f} MiB, idle {idle / MIB:.0f}"
    )
