"""A small HTTP/1.1 load generator on raw asyncio streams: keep-alive connections, pre-built request
bytes, minimal response parsing, so the client spends little CPU next to the server it measures.

Bounded by count and time; talks only to the loopback address it is given.
"""

from __future__ import annotations

import asyncio
import time

import attrs
import orjson


@attrs.define
class RunStats:
    """Latencies (seconds) of completed requests, failures, and the wall time of the run."""

    latencies: list[float] = attrs.Factory(list)
    failures: int = 0
    wall_s: float = 0.0
    sentences: int = 0


def build_request(host: str, port: int, path: str, body: dict) -> bytes:
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nContent-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + payload


async def _read_response(reader: asyncio.StreamReader) -> int:
    """Read one response; returns the status code. Assumes Content-Length framing."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
            break
    if length:
        await reader.readexactly(length)
    return status


async def _connection(
    host: str, port: int, requests: list[bytes], sentences_per_request: int, stats: RunStats, deadline: float
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for request in requests:
            if time.perf_counter() > deadline:
                break
            start = time.perf_counter()
            writer.write(request)
            status = await _read_response(reader)
            if status == 200:
                stats.latencies.append(time.perf_counter() - start)
                stats.sentences += sentences_per_request
            else:
                stats.failures += 1
    finally:
        writer.close()


async def run_load(
    host: str, port: int, requests_per_connection: list[list[bytes]], sentences_per_request: int, max_seconds: float
) -> RunStats:
    """Each connection sends its requests one after another; all connections run concurrently."""
    stats = RunStats()
    deadline = time.perf_counter() + max_seconds
    start = time.perf_counter()
    await asyncio.gather(
        *(_connection(host, port, reqs, sentences_per_request, stats, deadline) for reqs in requests_per_connection)
    )
    stats.wall_s = time.perf_counter() - start
    return stats
