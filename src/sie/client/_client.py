"""SIEClient and SIEAsyncClient: thin drivers that send, await and sleep around the shared core in `_base`.

The two mirror each other method for method (close/aclose) and differ only where they await.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from sie.client._base import Again, BaseClient
from sie.client._generation import GenerateParams, asse_payloads, sse_payloads
from sie.client._requests import Call, CallKnobs, EncodeParams, ExtractParams, ScoreParams
from sie.client._retry import DEFAULT_MAX_OOM_RETRIES, Random

T = TypeVar("T")
Item = Mapping[str, Any]


class SIEClient(BaseClient):
    """A synchronous client for an SIE server or gateway, wire-compatible with `sie-sdk` 0.10.1.

    Requests travel as msgpack and vectors come back as numpy arrays. Calls that meet a loading model, a
    full queue or a provisioning pool are retried for you, following the SIE retry contract.

    Usage:

    ```python
    >>> with SIEClient("http://localhost:8080") as client:
    ...     result = client.encode("sentence-transformers/all-MiniLM-L6-v2", {"text": "Hello world"})
    >>> result["dense"].shape
    (384,)
    ```

    Parameters:

    * **base_url** - the server's URL, such as `"http://localhost:8080"`.
    * **timeout_s** - *(optional)* one limit in seconds for connecting and for waiting on each answer.
    * **connect_timeout_s** / **read_timeout_s** - *(optional)* the two limits apart (default 10 s / 150 s).
    * **api_key** - *(optional)* sent as `Authorization: Bearer <api_key>`.
    * **gpu** - *(optional)* the default machine profile, `"l4"`, or pool and profile, `"mypool/l4"`.
    * **options** - *(optional)* runtime options sent with every call; a call's own options win.
    * **max_connections** - *(optional)* the most HTTP connections to keep open.
    * **transport** - *(optional)* an httpx transport, such as `httpx.MockTransport` in tests.
    * **sleep**, **clock**, **rng** - *(optional)* how the client waits between retries, reads the time and
      draws jitter; tests pass their own.
    """

    _http: httpx.Client

    def __init__(  # noqa: PLR0913 - the sie-sdk 0.10.1 constructor keywords, plus the test seams
        self,
        base_url: str,
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        api_key: str | None = None,
        gpu: str | None = None,
        options: Mapping[str, Any] | None = None,
        max_connections: int | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] | None = None,
        rng: Random | None = None,
    ) -> None:
        super().__init__(
            base_url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            api_key=api_key,
            gpu=gpu,
            options=options,
            clock=clock,
            rng=rng,
        )
        self._sleep = sleep
        self._http = httpx.Client(transport=transport, **self._http_options(max_connections))

    def encode(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature
        self,
        model: str,
        items: Item | list[Item],
        *,
        output_types: Sequence[str] | None = None,
        instruction: str | None = None,
        output_dtype: str | None = None,
        is_query: bool | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
    ) -> Any:
        """Encode one item or a list of items into vectors.

        Pass a single item and you get a single result back; pass a list and you get a list in the same
        order. Each result holds the outputs you asked for: `result["dense"]` (an ndarray),
        `result["sparse"]` (`{"indices", "values"}`) and `result["multivector"]` (a 2-D ndarray).

        * **output_types** - which outputs you want, such as `["dense", "sparse"]` (server default: dense).
        * **instruction**, **output_dtype** - an instruction for instruction-tuned models; `"float16"`, `"int8"`...
        * **is_query** - mark query-side inputs for asymmetric models; travels as `options.is_query`.
        * **options**, **gpu** - per-call runtime options and routing, over the client's defaults.
        * **wait_for_capacity** - keep retrying connection errors, provisioning and 504s within the budget.
        * **provision_timeout_s** - the budget for the whole call, retries included (default 900 s).
        * **max_oom_retries** - how often to retry RESOURCE_EXHAUSTED; 0 raises on the first one.
        """
        params = EncodeParams(
            output_types=output_types,
            instruction=instruction,
            output_dtype=output_dtype,
            is_query=is_query,
            options=options,
        )
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return self._send(self._encode_call(model, items, params, knobs))

    def score(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature
        self,
        model: str,
        query: Item,
        items: list[Item],
        *,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
    ) -> dict[str, Any]:
        """Score `items` against `query` with a reranker and get them back best first.

        You get `{"model", "query_id", "scores": [{"item_id", "score", "rank"}]}`; an item without an `id`
        is named `item-{i}` after its position. The retry keywords work as in `encode`.
        """
        params = ScoreParams(instruction=instruction, options=options)
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return self._send(self._score_call(model, query, items, params, knobs))

    def extract(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature
        self,
        model: str,
        items: Item | list[Item],
        *,
        labels: Sequence[str] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
    ) -> Any:
        """Extract entities, relations, classifications or objects from one item or a list of items.

        Every result has `entities`, `relations`, `classifications` and `objects` lists, empty when there
        is nothing to report. Pass the `labels` you are looking for, such as `["person", "organization"]`.
        The retry keywords work as in `encode`.
        """
        params = ExtractParams(labels=labels, output_schema=output_schema, instruction=instruction, options=options)
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return self._send(self._extract_call(model, items, params, knobs))

    def generate(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature (its text-only part)
        self,
        model: str,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
        read_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Generate text that continues `prompt`, and get it back whole.

        You get `{"model", "text", "finish_reason", "usage": {"prompt_tokens", "completion_tokens",
        "total_tokens"}, "attempt_id", "ttft_ms", "tpot_ms"}`. The prompt is raw: no chat template is applied.

        * **max_new_tokens** - the most tokens to generate.
        * **temperature**, **top_p**, **seed** - sampling; unset means the model's default, `temperature=0` greedy.
        * **stop** - strings that end the text; a stop string is never part of it.
        * **read_timeout_s** - how long to wait for the whole answer (default: the client's), never retried.

        Generation is not idempotent, so only answers that come before any work started are retried: 503
        PROVISIONING (with `wait_for_capacity`), MODEL_LOADING and RESOURCE_EXHAUSTED, 429 and full queues. A 504
        or a connection lost mid-request raises at once; the other keywords work as in `encode`.
        """
        params = GenerateParams(
            prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop, seed=seed
        )
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return self._send(
            self._generate_call(model, params, options, knobs, stream=False, read_timeout_s=read_timeout_s)
        )

    def stream_generate(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature (its text-only part)
        self,
        model: str,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
        read_timeout_s: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Generate text that continues `prompt`, chunk by chunk as it is decoded.

        Each chunk is `{"request_id", "seq", "text_delta", "done"}`; the last has `done: True`, `finish_reason`,
        `usage` and `ttft_ms`. Stop iterating early and the server cancels the generation. An error event raises
        its error: before the first chunk a capacity error is retried as in `generate`, after it never.
        `read_timeout_s` bounds the wait for each event. The keywords work as in `generate`.
        """
        params = GenerateParams(
            prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop, seed=seed
        )
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        call = self._generate_call(model, params, options, knobs, stream=True, read_timeout_s=read_timeout_s)
        yield from self._stream(call)

    def list_models(self) -> list[dict[str, Any]]:
        """List the models the server offers, each with its inputs, outputs, dims and state."""
        return self._send(self._models_call(None))

    def get_model(self, model: str) -> dict[str, Any]:
        """Get one model's details; an unknown model raises RequestError with code MODEL_NOT_FOUND."""
        return self._send(self._models_call(model))

    def close(self) -> None:
        """Close the connection pool; you can also use the client as a context manager."""
        self._http.close()

    def __enter__(self) -> SIEClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        run = self._start(call)
        while True:
            request = run.next_request()
            try:
                response = self._http.send(request)
            except httpx.RequestError as exc:
                delay = run.failed(exc)
            else:
                delay = run.answered(response)
                if delay is None:
                    return run.finish(response)
            self._sleep(delay)

    def _stream(self, call: Call[Any]) -> Iterator[dict[str, Any]]:
        run = self._start_stream(call)
        while True:
            request = run.next_request()
            try:
                response = self._http.send(request, stream=True)
            except httpx.RequestError as exc:
                delay = run.failed(exc)
            else:
                try:
                    if response.status_code != 200:
                        response.read()
                        delay = run.refused(response)
                    else:
                        run.opened(response)
                        for payload in sse_payloads(response.iter_lines()):
                            step = run.chunk(payload)
                            if isinstance(step, Again):
                                delay = step.delay
                                break
                            yield step
                        else:
                            return
                except httpx.RequestError as exc:
                    raise run.broken(exc) from exc
                finally:
                    response.close()
            self._sleep(delay)


class SIEAsyncClient(BaseClient):
    """An asyncio client for an SIE server or gateway, the mirror of SIEClient: same keywords, same results.

    Usage:

    ```python
    >>> async with SIEAsyncClient("http://localhost:8080") as client:
    ...     result = await client.encode("sentence-transformers/all-MiniLM-L6-v2", {"text": "Hello world"})
    ```

    The parameters are SIEClient's; **transport** takes an async httpx transport and **sleep** a coroutine
    function such as `asyncio.sleep`.
    """

    _http: httpx.AsyncClient

    def __init__(  # noqa: PLR0913 - the sie-sdk 0.10.1 constructor keywords, plus the test seams
        self,
        base_url: str,
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        api_key: str | None = None,
        gpu: str | None = None,
        options: Mapping[str, Any] | None = None,
        max_connections: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] | None = None,
        rng: Random | None = None,
    ) -> None:
        super().__init__(
            base_url,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s,
            api_key=api_key,
            gpu=gpu,
            options=options,
            clock=clock,
            rng=rng,
        )
        self._sleep = sleep
        self._http = httpx.AsyncClient(transport=transport, **self._http_options(max_connections))

    async def encode(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature
        self,
        model: str,
        items: Item | list[Item],
        *,
        output_types: Sequence[str] | None = None,
        instruction: str | None = None,
        output_dtype: str | None = None,
        is_query: bool | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
    ) -> Any:
        """Encode one item or a list of items into vectors; see `SIEClient.encode`."""
        params = EncodeParams(
            output_types=output_types,
            instruction=instruction,
            output_dtype=output_dtype,
            is_query=is_query,
            options=options,
        )
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return await self._send(self._encode_call(model, items, params, knobs))

    async def score(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature
        self,
        model: str,
        query: Item,
        items: list[Item],
        *,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
    ) -> dict[str, Any]:
        """Score `items` against `query` and get them back best first; see `SIEClient.score`."""
        params = ScoreParams(instruction=instruction, options=options)
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return await self._send(self._score_call(model, query, items, params, knobs))

    async def extract(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature
        self,
        model: str,
        items: Item | list[Item],
        *,
        labels: Sequence[str] | None = None,
        output_schema: Mapping[str, Any] | None = None,
        instruction: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
    ) -> Any:
        """Extract entities, relations, classifications or objects; see `SIEClient.extract`."""
        params = ExtractParams(labels=labels, output_schema=output_schema, instruction=instruction, options=options)
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        return await self._send(self._extract_call(model, items, params, knobs))

    async def generate(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature (its text-only part)
        self,
        model: str,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
        read_timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Generate text that continues `prompt`, and get it back whole; see `SIEClient.generate`."""
        params = GenerateParams(
            prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop, seed=seed
        )
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        call = self._generate_call(model, params, options, knobs, stream=False, read_timeout_s=read_timeout_s)
        return await self._send(call)

    async def stream_generate(  # noqa: PLR0913 - the sie-sdk 0.10.1 signature (its text-only part)
        self,
        model: str,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES,
        read_timeout_s: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Generate text chunk by chunk, as an async iterator; see `SIEClient.stream_generate`.

        To stop early and close the stream at once, iterate inside `contextlib.aclosing(...)`.
        """
        params = GenerateParams(
            prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop, seed=seed
        )
        knobs = CallKnobs(
            gpu=gpu,
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        call = self._generate_call(model, params, options, knobs, stream=True, read_timeout_s=read_timeout_s)
        async for chunk in self._stream(call):
            yield chunk

    async def list_models(self) -> list[dict[str, Any]]:
        """List the models the server offers; see `SIEClient.list_models`."""
        return await self._send(self._models_call(None))

    async def get_model(self, model: str) -> dict[str, Any]:
        """Get one model's details; see `SIEClient.get_model`."""
        return await self._send(self._models_call(model))

    async def aclose(self) -> None:
        """Close the connection pool; you can also use the client as an async context manager."""
        await self._http.aclose()

    async def __aenter__(self) -> SIEAsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        run = self._start(call)
        while True:
            request = run.next_request()
            try:
                response = await self._http.send(request)
            except httpx.RequestError as exc:
                delay = run.failed(exc)
            else:
                delay = run.answered(response)
                if delay is None:
                    return run.finish(response)
            await self._sleep(delay)

    async def _stream(self, call: Call[Any]) -> AsyncIterator[dict[str, Any]]:
        run = self._start_stream(call)
        while True:
            request = run.next_request()
            try:
                response = await self._http.send(request, stream=True)
            except httpx.RequestError as exc:
                delay = run.failed(exc)
            else:
                try:
                    if response.status_code != 200:
                        await response.aread()
                        delay = run.refused(response)
                    else:
                        run.opened(response)
                        async for payload in asse_payloads(response.aiter_lines()):
                            step = run.chunk(payload)
                            if isinstance(step, Again):
                                delay = step.delay
                                break
                            yield step
                        else:
                            return
                except httpx.RequestError as exc:
                    raise run.broken(exc) from exc
                finally:
                    await response.aclose()
            await self._sleep(delay)
