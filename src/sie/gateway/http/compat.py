"""The routes of the other servers' dialects (TEI, Cohere/Jina, Ollama): each handler decodes the body, makes the
dialect's one call over `InferenceService` (`tei`, `cohere`, `ollama` shape them) and renders JSON; its failures
answer in the dialect's own error envelope (`Surface`). Routing, admission, batching, limits, auth, metrics and
tracing are the native routes' own: nothing below the handler differs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.gateway.errors import InvalidRequestError
from sie.gateway.http import cohere, ollama, openai, tei
from sie.gateway.http.edge import endpoint, json_response, lane_hints, served_response
from sie.gateway.http.inference import InferenceHandlers
from sie.gateway.http.negotiation import decode_data
from sie.gateway.http.replies import Surface
from sie.gateway.inference import InferenceService
from sie.gateway.router import CatalogSource
from sie.http.bodies import read_body
from sie.telemetry.requests import note_request
from sie.telemetry.tracing import Tracing

TEI_EMBED_ROUTES = tuple(tei.EMBED_OUTPUTS)  # embed, embed_sparse, embed_all
# First path segments of the server's own routes: a TEI base URL's model path never starts with one, so a POST to
# an unknown native path stays a 404/405, not a model lookup.
RESERVED_SEGMENTS = ("v1", "v2", "api", "ws", "health", "healthz", "readyz", "metrics", "docs", "openapi.json")


class TeiModelConvertor(Convertor[str]):
    """A model id in a TEI base URL: any path not starting with one of RESERVED_SEGMENTS."""

    regex = "(?!(?:" + "|".join(segment.replace(".", "\\.") for segment in RESERVED_SEGMENTS) + ")(?:/|$))[^/].*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("tei_model", TeiModelConvertor())


class DialectHandlers(InferenceHandlers):
    """The dialect routes over the same inference service as the native ones (TEI's `/info` reads the catalogue)."""

    def __init__(
        self,
        service: InferenceService,
        max_body_bytes: int,
        tracing: Tracing | None,
        catalog: CatalogSource,
        max_items: int,
        default_models: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(service, max_body_bytes, tracing)
        self._catalog = catalog
        self._max_items = max_items
        self._default_models = dict(default_models or {})

    def _default_model(self, route: str) -> str:
        """The model a TEI request at the root's `/{route}` goes to (SIE_COMPAT_DEFAULT_MODELS), or a 400."""
        model = self._default_models.get(route)
        if model is None:
            raise InvalidRequestError(
                f"POST /{route} names no model: use the model's TEI base URL (POST /{{model}}/{route}), or set "
                f"SIE_COMPAT_DEFAULT_MODELS={route}=<model> on the server"
            )
        return model

    async def _data(self, request: Request) -> object:
        raw = await read_body(request, self._max_body_bytes)
        return decode_data(raw, request.headers.get("content-type"))

    # --- TEI: the model is the base URL's path --------------------------------------------------------------------

    @endpoint(Surface.TEI)
    async def tei_embed(self, request: Request) -> Response:
        """`/{model}/embed`, `/embed_sparse`, `/embed_all`, or the same at the root for the route's
        SIE_COMPAT_DEFAULT_MODELS model."""
        started = time.perf_counter()
        route = request.url.path.rsplit("/", 1)[-1]
        call = tei.parse_embed(self._path_model(request, route), route, await self._data(request))
        note_request(model=call.model)
        work = functools.partial(tei.embed, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    @endpoint(Surface.TEI)
    async def tei_predict(self, request: Request) -> Response:
        """`/{model}/predict`, or `/predict` for the SIE_COMPAT_DEFAULT_MODELS `predict` model."""
        started = time.perf_counter()
        call = tei.parse_predict(self._path_model(request, "predict"), await self._data(request))
        note_request(model=call.model, items=len(call.pairs))
        work = functools.partial(tei.predict, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    @endpoint(Surface.TEI)
    async def tei_tokenize(self, request: Request) -> Response:
        """`/{model}/tokenize`, or `/tokenize` for the SIE_COMPAT_DEFAULT_MODELS `tokenize` model."""
        started = time.perf_counter()
        call = tei.parse_tokenize(self._path_model(request, "tokenize"), await self._data(request))
        note_request(model=call.model, items=len(call.texts))
        work = functools.partial(tei.tokenize, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    @endpoint(Surface.TEI)
    async def tei_decode(self, request: Request) -> Response:
        """`/{model}/decode`, or `/decode` for the SIE_COMPAT_DEFAULT_MODELS `decode` model."""
        started = time.perf_counter()
        call = tei.parse_decode(self._path_model(request, "decode"), await self._data(request))
        note_request(model=call.model, items=len(call.sequences))
        work = functools.partial(tei.decode, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    def _path_model(self, request: Request, route: str) -> str:
        model = request.path_params.get("model")
        return model if model is not None else self._default_model(route)

    @endpoint(Surface.TEI)
    async def tei_root(self, request: Request) -> Response:
        """TEI's `POST /`: here it embeds (the route every TEI client can reach with only a base URL)."""
        started = time.perf_counter()
        call = tei.parse_embed(request.path_params["model"], "embed", await self._data(request))
        work = functools.partial(tei.embed, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    @endpoint(Surface.OPENAI)
    async def tei_openai_embeddings(self, request: Request) -> Response:
        """TEI's OpenAI routes under the model's base URL (`/{model}/v1/embeddings`, an OpenAI client's `base_url`
        of `{server}/{model}/v1`, and `/{model}/embeddings`): the path names the model, as a TEI server embeds with
        the one model it was started with whatever the body's `model` says."""
        started = time.perf_counter()
        data = await self._data(request)
        if isinstance(data, dict):
            data = {**data, "model": request.path_params["model"]}
        call = openai.parse_embeddings(data)
        work = functools.partial(openai.embeddings, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    @endpoint(Surface.TEI)
    async def tei_info(self, request: Request) -> Response:
        spec = request.path_params["model"]
        entry = self._catalog().resolve(spec).entry
        pooling = entry.model.resolve_profile(entry.profile).runtime_options.get("pooling")
        return json_response(tei.info_body(entry.model_id, entry.model, pooling, self._max_items))

    @endpoint(Surface.TEI)
    async def tei_rerank(self, request: Request) -> Response:
        started = time.perf_counter()
        return await self._tei_rerank(request, await self._data(request), started)

    @endpoint(Surface.TEI)
    async def _tei_rerank(self, request: Request, data: object, started: float) -> Response:
        """TEI's rerank of `data` for `/{model}/rerank`, or for the SIE_COMPAT_DEFAULT_MODELS `rerank` model when a
        TEI body reaches the root's `/rerank` (read there by the Cohere/Jina handler)."""
        call = tei.parse_rerank(self._path_model(request, "rerank"), data)
        note_request(model=call.model)
        work = functools.partial(tei.rerank, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    # --- Cohere / Jina: the model is the body's ---------------------------------------------------------------------

    @endpoint(Surface.COHERE)
    async def rerank(self, request: Request) -> Response:
        """`/v1/rerank`, `/v2/rerank` and `/rerank`: Cohere's and Jina's shape; a `/rerank` body with TEI's `texts` is
        TEI's, for the SIE_COMPAT_DEFAULT_MODELS `rerank` model."""
        started = time.perf_counter()
        data = await self._data(request)
        if request.url.path == "/rerank" and isinstance(data, dict) and "texts" in data and "documents" not in data:
            return await self._tei_rerank(request, data, started)
        call = cohere.parse_rerank(data, return_documents_default=not request.url.path.startswith("/v2/"))
        note_request(model=call.model)
        work = functools.partial(cohere.rerank, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    @endpoint(Surface.COHERE)
    async def cohere_embed(self, request: Request) -> Response:
        started = time.perf_counter()
        call = cohere.parse_embed(await self._data(request))
        note_request(model=call.model)
        work = functools.partial(cohere.embed, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)

    # --- Ollama -------------------------------------------------------------------------------------------------------

    @endpoint(Surface.OLLAMA)
    async def ollama_embed(self, request: Request) -> Response:
        started = time.perf_counter()
        data = await self._data(request)
        call = ollama.parse_embeddings(data) if request.url.path.endswith("/embeddings") else ollama.parse_embed(data)
        note_request(model=call.model)
        work = functools.partial(ollama.embed, self._service, call, lane_hints(request))
        return served_response(await self._serve(request, work, call.model), None, started)


def dialect_routes(handlers: DialectHandlers) -> list[Route]:
    """The dialects' routes; the TEI ones match any model path, so they go after every other route."""
    return [
        Route("/v1/rerank", handlers.rerank, methods=["POST"]),
        Route("/v2/rerank", handlers.rerank, methods=["POST"]),
        Route("/rerank", handlers.rerank, methods=["POST"]),
        Route("/v2/embed", handlers.cohere_embed, methods=["POST"]),
        Route("/api/embed", handlers.ollama_embed, methods=["POST"]),
        Route("/api/embeddings", handlers.ollama_embed, methods=["POST"]),
        *(Route(f"/{name}", handlers.tei_embed, methods=["POST"]) for name in TEI_EMBED_ROUTES),
        Route("/predict", handlers.tei_predict, methods=["POST"]),
        Route("/tokenize", handlers.tei_tokenize, methods=["POST"]),
        Route("/decode", handlers.tei_decode, methods=["POST"]),
        *(Route(f"/{{model:tei_model}}/{name}", handlers.tei_embed, methods=["POST"]) for name in TEI_EMBED_ROUTES),
        Route("/{model:tei_model}/rerank", handlers.tei_rerank, methods=["POST"]),
        Route("/{model:tei_model}/predict", handlers.tei_predict, methods=["POST"]),
        Route("/{model:tei_model}/tokenize", handlers.tei_tokenize, methods=["POST"]),
        Route("/{model:tei_model}/decode", handlers.tei_decode, methods=["POST"]),
        Route("/{model:tei_model}/info", handlers.tei_info, methods=["GET"]),
        *(
            Route(f"/{{model:tei_model}}/{path}", handlers.tei_openai_embeddings, methods=["POST"])
            for path in ("v1/embeddings", "embeddings")
        ),
        Route("/{model:tei_model}", handlers.tei_root, methods=["POST"]),
    ]
