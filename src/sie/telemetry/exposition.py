"""`GET /metrics` as a framework-free plain handler (`sie.http.plain`): this process's instruments in Prometheus
text format, followed by its worker children's series, each labelled with the child's `worker` name and `device`.

Children are asked at scrape time (the `WorkerMetrics` IPC call, or a direct call in `--role all`), all at once,
each within CHILD_TIMEOUT_S; a child that does not answer is left out of that scrape. Families of the same name
from several children are merged into one, so the output has each `# TYPE` once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Final

import attrs
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from sie.telemetry.metrics import Telemetry

logger = logging.getLogger(__name__)

METRICS_PATH: Final = "/metrics"
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
CHILD_TIMEOUT_S: Final = 2.0
# The resource description each process exports; the children's would repeat the parent's family.
_SKIPPED_FAMILIES: Final = frozenset({"target_info"})


@attrs.frozen
class MetricsReply:
    """One answer (a `sie.http.plain.PlainReply`)."""

    status: int
    content_type: str
    body: bytes


@attrs.frozen
class ChildSource:
    """One worker child whose series are merged: its name, its device and how to get its exposition text."""

    name: str
    device: str
    fetch: Callable[[], Awaitable[str]]


class MetricsEndpoint:
    """Answers `GET /metrics` (HEAD arrives as GET); `handle` returns None for every other path."""

    def __init__(self, telemetry: Telemetry, children: Callable[[], Iterable[ChildSource]] | None = None) -> None:
        self._telemetry = telemetry
        self._children = children

    async def handle(self, method: str, path: str, query: Mapping[str, str], body: bytes) -> MetricsReply | None:
        if path != METRICS_PATH:
            return None
        if not self._telemetry.enabled:
            return _refusal(404, "not_found", "metrics are off (SIE_METRICS_ENABLED=false)")
        if method != "GET":
            return _refusal(405, "method_not_allowed", f"{METRICS_PATH} answers GET, not {method}")
        text = self._telemetry.prometheus_text()
        if self._children is not None:
            text += merged_children(await _fetch_all(list(self._children())))
        return MetricsReply(200, CONTENT_TYPE, text)


def _refusal(status: int, code: str, message: str) -> MetricsReply:
    """A refusal in the `{"error": {"code", "message"}}` envelope of the placement surface sharing these ports."""
    return MetricsReply(status, "application/json", orjson.dumps({"error": {"code": code, "message": message}}))


async def _fetch_all(children: list[ChildSource]) -> list[tuple[ChildSource, str]]:
    async def one(child: ChildSource) -> str:
        async with asyncio.timeout(CHILD_TIMEOUT_S):
            return await child.fetch()

    answers = await asyncio.gather(*(one(child) for child in children), return_exceptions=True)
    fetched = []
    for child, answer in zip(children, answers, strict=True):
        if isinstance(answer, BaseException):
            logger.debug("worker child %s gave no metrics: %r", child.name, answer)
        else:
            fetched.append((child, answer))
    return fetched


def merged_children(texts: Iterable[tuple[ChildSource, str]]) -> bytes:
    """The children's families, one per name, every sample labelled `worker` and `device`."""
    families: dict[str, Metric] = {}
    for child, text in texts:
        extra = {"worker": child.name, "device": child.device}
        for family in text_string_to_metric_families(text):
            if family.name in _SKIPPED_FAMILIES:
                continue
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            merged.samples.extend(sample._replace(labels={**sample.labels, **extra}) for sample in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector yielding fixed families (rendered once, by `generate_latest`)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
