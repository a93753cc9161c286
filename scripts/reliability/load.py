"""Closed-loop clients that check every answer: N clients, each sending its own distinct texts to /v1/encode
through the public SDK (`sie.client.SIEAsyncClient`, so retries follow the SDK's ladder within each call's
deadline), each returned vector compared with its own text's reference. A call ends verified, failed (an error
answer after the SDK's retries) or lost (no answer by its deadline, or an answer of another text: swapped,
duplicated, missing). Recovery is the time from a fault to the first 200 of an attempt sent after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections import Counter
from collections.abc import Sequence

import attrs
import httpx
import numpy as np

from sie.client import IncompleteBatchError, SIEAsyncClient, SIEError

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# An answer within this of its text's reference (largest absolute difference over the 384 values) is that
# text's: batching and padding move fp32 results by about 1e-6; another text's vector differs by about 0.1.
TOLERANCE = 1e-3
# References must differ from each other by this many tolerances, or a swap could pass as verified.
DISTINCT_FACTOR = 10.0
REFERENCE_BATCH = 32
CONNECT_TIMEOUT_S = 5.0

VERIFIED, FAILED, LOST = "verified", "failed", "lost"

_WORDS = (
    "amber", "river", "quiet", "engine", "harbor", "violet", "signal", "orchard", "lantern", "meadow", "copper",
    "falcon", "glacier", "ribbon", "thunder", "canyon", "velvet", "compass", "ember", "willow", "marble", "beacon",
    "saddle", "prism", "hollow", "tundra", "quarry", "summit", "cobalt", "basil", "cedar", "dune", "feather",
    "granite", "island", "jasmine", "kettle", "lemon", "mosaic", "nectar", "opal", "pepper", "quill", "raven",
    "spruce", "tulip", "umber", "vapor", "walnut", "yarrow", "zephyr", "anchor", "bridge", "candle", "delta",
    "echo", "fable", "garnet", "hazel", "ivory", "juniper",
)  # fmt: skip


def make_texts(count: int, seed: int = 13) -> list[str]:
    """`count` distinct texts of 40-60 words (the index is in each, so no two are alike)."""
    rng = random.Random(seed)
    return [f"{index} " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(40, 60))) for index in range(count)]


class References:
    """The reference vector of every text, computed on a healthy cluster before any fault."""

    def __init__(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.texts = list(texts)
        self.vectors = vectors

    @classmethod
    async def compute(cls, url: str, texts: Sequence[str], timeout_s: float = 120.0) -> References:
        """One encode per REFERENCE_BATCH texts; refuses references too close to tell apart."""
        vectors = []
        async with SIEAsyncClient(url, timeout_s=timeout_s) as client:
            for start in range(0, len(texts), REFERENCE_BATCH):
                chunk = [{"text": text} for text in texts[start : start + REFERENCE_BATCH]]
                results = await client.encode(MODEL, chunk, provision_timeout_s=timeout_s)
                vectors.extend(np.asarray(result["dense"], dtype=np.float32) for result in results)
        references = cls(texts, np.stack(vectors))
        references.check_distinct()
        return references

    def check_distinct(self) -> None:
        """Raise when two references are within DISTINCT_FACTOR tolerances of each other."""
        vectors = self.vectors
        for index in range(len(vectors)):
            others = np.delete(vectors, index, axis=0)
            closest = float(np.abs(others - vectors[index]).max(axis=1).min()) if len(others) else np.inf
            if closest <= TOLERANCE * DISTINCT_FACTOR:
                raise ValueError(f"text {index} has a reference within {closest:.2g} of another's")

    def mismatch(self, index: int, vector: object) -> str | None:
        """Why `vector` is not text `index`'s answer, or None when it is."""
        values = np.asarray(vector, dtype=np.float32)
        if values.shape != self.vectors[index].shape:
            return f"a vector of shape {values.shape}"
        if float(np.abs(values - self.vectors[index]).max()) > TOLERANCE:
            return "another text's vector"
        return None


@attrs.frozen
class LoadOptions:
    """How hard and how long a scenario loads the cluster; `deadline_s` is each call's SDK budget. With `settle_s`
    None the load lasts `duration_s`; otherwise it ends `settle_s` after the first 200 of an attempt sent once the
    fault was undone (so calls sent after the recovery are checked too), `duration_s` at the most."""

    clients: int = 300
    duration_s: float = 40.0  # load per scenario (the most of it when settle_s is set)
    fault_at_s: float = 5.0  # into the load
    deadline_s: float = 30.0
    items: int = 1  # texts per call
    texts_per_client: int = 4  # each client cycles through its own texts, never the same twice in a row
    settle_s: float | None = None  # None: a fixed duration_s of load

    @property
    def text_count(self) -> int:
        return self.clients * max(self.texts_per_client, 2 * self.items)

    def texts_of(self, client: int, call: int) -> list[int]:
        """The text indices of a client's `call`-th call: its own slice of the texts, in turn."""
        own = max(self.texts_per_client, 2 * self.items)
        return [client * own + (call * self.items + offset) % own for offset in range(self.items)]


class AttemptLog:
    """When each attempt answered 200 was sent and answered, and how the others ended (status and
    X-SIE-Error-Code, or the exception), which the SDK retried or not."""

    def __init__(self) -> None:
        self.successes: list[tuple[float, float]] = []
        self.refusals: Counter[str] = Counter()
        self._tls = ssl.create_default_context()  # one for every client: each costs milliseconds to make
        self._awaited: tuple[float, asyncio.Event] | None = None  # a moment someone waits for a 200 sent after

    def succeeded(self, sent: float, answered: float) -> None:
        """Note an attempt answered 200, waking `success_after`'s waiter when it was sent late enough."""
        self.successes.append((sent, answered))
        if self._awaited is not None and sent >= self._awaited[0]:
            self._awaited[1].set()

    async def success_after(self, moment: float, timeout_s: float) -> bool:
        """Wait until an attempt sent at or after `moment` has answered 200; False when none has in `timeout_s`."""
        if self.first_success_after(moment) is not None:
            return True
        self._awaited = (moment, asyncio.Event())
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._awaited[1].wait()
        except TimeoutError:
            return False
        finally:
            self._awaited = None
        return True

    def transport(self) -> httpx.AsyncBaseTransport:
        """One client's HTTP transport (one connection), noting its attempts here."""
        return _RecordingTransport(self, self._tls)

    def first_success_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first 200 of an attempt sent at or after it (None: there was none)."""
        answered = [done for sent, done in self.successes if sent >= moment]
        return min(answered) - moment if answered else None


class _RecordingTransport(httpx.AsyncBaseTransport):
    """A one-connection transport per client: httpx's pool looks for a free connection on every request, which
    costs the load generator more than the cluster it measures once it holds hundreds."""

    def __init__(self, log: AttemptLog, tls: ssl.SSLContext) -> None:
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self._inner = httpx.AsyncHTTPTransport(verify=tls, limits=one)
        self._log = log

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        sent = time.monotonic()
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.HTTPError as exc:
            self._log.refusals[type(exc).__name__] += 1
            raise
        if response.status_code == 200:
            self._log.succeeded(sent, time.monotonic())
        else:
            self._log.refusals[f"{response.status_code} {response.headers.get('x-sie-error-code', '')}".strip()] += 1
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@attrs.frozen
class Tally:
    """One scenario's row: calls sent and how they ended, recovery seconds, and a few failure reasons."""

    scenario: str
    sent: int
    verified: int
    failed: int
    lost: int
    recovery_s: float | None
    slowest_s: float  # the longest call, retries included
    across: int  # calls sent before the fault that ended after it (the ones the fault could hurt)
    reasons: tuple[tuple[str, int], ...] = ()
    refusals: tuple[tuple[str, int], ...] = ()  # attempts that did not answer 200, by status and code


class Load:
    """`clients` closed-loop callers against `url`; `start()`, then `stop()` lets every call in flight end."""

    def __init__(self, url: str, references: References, options: LoadOptions) -> None:
        if len(references.texts) < options.text_count:
            raise ValueError(f"{options.text_count} texts needed, {len(references.texts)} referenced")
        self._references = references
        self._options = options
        self.attempts = AttemptLog()
        self._url = url
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._answered_once: set[int] = set()  # clients whose first call has ended
        self._warm: asyncio.Event | None = None
        self.outcomes: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.spans: list[tuple[float, float]] = []  # when each call was sent and when it ended

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._warm = asyncio.Event()
        self._tasks = [loop.create_task(self._run(client)) for client in range(self._options.clients)]

    async def warmed_up(self) -> None:
        """Return once every client's first call has ended (all of them connected and calling), or after a
        deadline: a fault before that would hit a cluster with less than the full load."""
        if self._warm is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._options.deadline_s):
                    await self._warm.wait()

    async def last_until_settled(self, started: float, undone_at: float) -> None:
        """Keep loading to `duration_s` after `started`; with `settle_s`, only to `settle_s` after the first 200 of
        an attempt sent at or after `undone_at` (the moment the fault was undone), when that comes sooner."""
        end = started + self._options.duration_s
        settle_s = self._options.settle_s
        if settle_s is not None and await self.attempts.success_after(undone_at, end - time.monotonic()):
            end = min(end, time.monotonic() + settle_s)
        await asyncio.sleep(max(0.0, end - time.monotonic()))

    async def stop(self) -> None:
        """Send no new calls; wait for those in flight (each ends by its deadline)."""
        self._stopping = True
        await asyncio.gather(*self._tasks)

    def tally(self, scenario: str, fault_at: float) -> Tally:
        recovery = self.attempts.first_success_after(fault_at)
        across = sum(1 for sent, ended in self.spans if sent < fault_at <= ended)
        return Tally(
            scenario,
            sum(self.outcomes.values()),
            self.outcomes[VERIFIED],
            self.outcomes[FAILED],
            self.outcomes[LOST],
            recovery,
            max((ended - sent for sent, ended in self.spans), default=0.0),
            across,
            tuple(self.reasons.most_common(5)),
            tuple(self.attempts.refusals.most_common(5)),
        )

    async def _run(self, client: int) -> None:
        deadline = self._options.deadline_s
        transport = self.attempts.transport()
        async with SIEAsyncClient(self._url, read_timeout_s=deadline, connect_timeout_s=CONNECT_TIMEOUT_S,
                                  transport=transport) as sdk:  # fmt: skip
            call = 0
            while not self._stopping:
                sent = time.monotonic()
                outcome, reason = await self._call(sdk, self._options.texts_of(client, call))
                self.spans.append((sent, time.monotonic()))
                call += 1
                self._answered_once.add(client)
                if len(self._answered_once) == self._options.clients and self._warm is not None:
                    self._warm.set()
                self.outcomes[outcome] += 1
                if reason:
                    self.reasons[f"{outcome}: {reason}"] += 1

    async def _call(self, sdk: SIEAsyncClient, indices: list[int]) -> tuple[str, str | None]:
        items = [{"id": f"t{index}", "text": self._references.texts[index]} for index in indices]
        deadline = self._options.deadline_s
        try:
            # The SDK caps each attempt's timeouts by the budget left, except one last attempt after a capacity
            # wait (PROVISIONING, MODEL_LOADING) that used the budget up: an answer to it is too late to count.
            async with asyncio.timeout(deadline):
                results = await sdk.encode(MODEL, items, provision_timeout_s=deadline)
        except TimeoutError as exc:  # the SDK's own read timeout (SIETimeoutError) or ours
            return LOST, f"no answer by the deadline ({type(exc).__name__})"
        except IncompleteBatchError:
            return LOST, "a wrong number of results"
        except SIEError as exc:
            return FAILED, _reason(exc)
        return self._verify(indices, results)

    def _verify(self, indices: list[int], results: list[dict[str, object]]) -> tuple[str, str | None]:
        for index, result in zip(indices, results, strict=True):
            if result.get("id") != f"t{index}":
                return LOST, "another item's answer"
            problem = self._references.mismatch(index, result.get("dense"))
            if problem is not None:
                return LOST, problem
        return VERIFIED, None


def _reason(error: SIEError) -> str:
    """A short, bounded description of a failure: its class, status and code (no per-request text)."""
    code = getattr(error, "code", None)
    status = getattr(error, "status_code", None)
    return f"{type(error).__name__} {status or ''} {code or ''}".strip()
