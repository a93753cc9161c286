"""The OpenAPI 3.1 description of the gateway's public routes (seed 000 §14), served at `/openapi.json` and drawn
by `/docs`. Written by hand, one entry per route: `openapi_document` lists those the app really serves, so the
gateway role and `--role all` (which adds the placement surface) each describe themselves. Pure data.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from sie.gateway.http.headers import SIE_VERSION

OPENAPI_VERSION: Final = "3.1.0"

_JSON_OR_MSGPACK: Final = ("application/json", "application/msgpack")


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(schema: str, media_types: Iterable[str] = _JSON_OR_MSGPACK) -> dict[str, Any]:
    return {"required": True, "content": {media: {"schema": _ref(schema)} for media in media_types}}


def _answer(description: str, schema: str | None = None, media: str = "application/json") -> dict[str, Any]:
    return {"description": description, **({"content": {media: {"schema": _ref(schema)}}} if schema else {})}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": {"type": "string"}}


def _query_param(name: str, description: str, kind: str = "integer") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": {"type": kind}}


def _operation(tag: str, summary: str, **fields: Any) -> dict[str, Any]:
    responses = fields.pop("responses", None) or {"200": _answer("OK")}
    return {"tags": [tag], "summary": summary, **fields, "responses": responses}


_POOL = _path_param("name", "Pool name.")
_MODEL = _path_param("model", "Model id, slashes included (`BAAI/bge-m3`), optionally `bundle:/org/model`.")
_LANE_HEADERS = [
    {
        "name": "X-SIE-MACHINE-PROFILE",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "Machine profile (`l4`) or `pool/profile` the work is queued for.",
    },
    {
        "name": "X-SIE-Pool",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": "Pool the work is for (`default`, a static queue pool or one made with `POST /v1/pools`); "
        "a pool that does not exist is 404 `POOL_NOT_FOUND`.",
    },
]
_INFERENCE_ERRORS = {
    "400": _answer("Invalid input (`INVALID_INPUT`)", "ErrorEnvelope"),
    "404": _answer("Unknown model (`MODEL_NOT_FOUND`) or pool (`POOL_NOT_FOUND`)", "ErrorEnvelope"),
    "413": _answer("Body over SIE_GATEWAY_MAX_BODY_BYTES", "ErrorEnvelope"),
    "503": _answer("Queue full, unavailable, model loading or provisioning; see `Retry-After`", "ErrorEnvelope"),
}


def _inference(summary: str, request: str, result: str) -> dict[str, Any]:
    return _operation(
        "inference",
        summary,
        parameters=[_MODEL, *_LANE_HEADERS],
        requestBody=_body(request),
        responses={
            "200": {
                "description": "Results: JSON, or msgpack when `Accept` names it",
                "content": {media: {"schema": _ref(result)} for media in _JSON_OR_MSGPACK},
            },
            **_INFERENCE_ERRORS,
        },
    )


_OPENAI_ERRORS = {
    "400": _answer("OpenAI error envelope: invalid or unsupported field, or a model that does not generate"),
    "404": _answer("OpenAI error envelope: unknown model (`model_not_found`)"),
    "503": _answer("OpenAI error envelope: provisioning, queue full, worker out of memory; see `Retry-After`"),
    "504": _answer("OpenAI error envelope: no generated text within the request timeout"),
}
_SAMPLING_FIELDS = {
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
    "seed": {"type": "integer"},
    "stream": {"type": "boolean"},
}
_LETTER = _path_param("letter_id", "Dead letter id.")
_ADMIN = "Needs `Authorization: Bearer <SIE_ADMIN_TOKEN>` when the admin token is set."

_TEI_MODEL = _path_param("model", "The model, as a TEI base URL's path: `http://host:8080/{model}`.")
_TEI_ERRORS = "TEI error `{error, error_type}` (validation failures 422); the SIE code in `X-SIE-Error-Code`"
_COHERE_ERRORS = "`{message}`; the SIE code in `X-SIE-Error-Code`"
_OLLAMA_ERRORS = "`{error}`; the SIE code in `X-SIE-Error-Code`"
# The other servers' dialects (`compat.py`): (starlette template, OpenAPI path, summary, answer, errors).
_DIALECT_ROUTES: Final = (
    ("/{model:tei_model}/embed", "/{model}/embed", "TEI embed: `inputs`, `normalize`, `truncate`, `prompt_name`, "
     "`dimensions`", "`[[float]]`", _TEI_ERRORS),
    ("/{model:tei_model}/embed_sparse", "/{model}/embed_sparse", "TEI sparse embed (SPLADE, BGE-M3)",
     "`[[{index, value}]]`", _TEI_ERRORS),
    ("/{model:tei_model}/embed_all", "/{model}/embed_all", "TEI token vectors (a multi-vector model or variant)",
     "`[[[float]]]`", _TEI_ERRORS),
    ("/{model:tei_model}/rerank", "/{model}/rerank", "TEI rerank: `query`, `texts`, `return_text`",
     "`[{index, score, text?}]`, best first", _TEI_ERRORS),
    ("/{model:tei_model}/predict", "/{model}/predict", "TEI predict: `inputs` a `[text, text_pair]` pair or a list "
     "of them (a model that scores)", "`[[{score, label}]]`", _TEI_ERRORS),
    ("/{model:tei_model}/tokenize", "/{model}/tokenize", "TEI tokenize: `inputs`, `add_special_tokens`, "
     "`prompt_name` (the model's tokenizer, cut at its length)", "`[[{id, text, special, start, stop}]]`",
     _TEI_ERRORS),
    ("/{model:tei_model}/decode", "/{model}/decode", "TEI decode: `ids` (a list, or a list of lists), "
     "`skip_special_tokens`", "`[text]`", _TEI_ERRORS),
    *((f"/{{model:tei_model}}/{path}", f"/{{model}}/{path}", "TEI's OpenAI route: `/v1/embeddings` with the model from "
       "the path (the body's `model` is not read)", "OpenAI `{object, data, model, usage}`",
       "OpenAI `{error: {message, type, param, code}}`") for path in ("v1/embeddings", "embeddings")),
    ("/{model:tei_model}", "/{model}", "TEI's root route: embeds, as `/{model}/embed`", "`[[float]]`", _TEI_ERRORS),
    ("/v1/rerank", "/v1/rerank", "Cohere v1 / Jina rerank: `model`, `query`, `documents`, `top_n`, "
     "`return_documents` (default true)", "`{id, model, results: [{index, relevance_score, document?}], meta, usage}`",
     _COHERE_ERRORS),
    ("/v2/rerank", "/v2/rerank", "Cohere v2 rerank (`return_documents` default false)",
     "`{id, model, results, meta, usage}`", _COHERE_ERRORS),
    ("/rerank", "/rerank", "Jina rerank (`model`, `documents`); a body with TEI's `texts` is TEI's rerank of the "
     "SIE_COMPAT_DEFAULT_MODELS `rerank` model", "`{id, model, results, meta, usage}`, or TEI's `[{index, score, "
     "text?}]`", _COHERE_ERRORS),
    *((f"/{route}", f"/{route}", f"TEI `/{route}` at the root: the SIE_COMPAT_DEFAULT_MODELS `{route}` model "
       f"(TEI's 422 without one; `/{{model}}/{route}` needs none)", answer, _TEI_ERRORS)
      for route, answer in (("embed", "`[[float]]`"), ("embed_sparse", "`[[{index, value}]]`"),
                            ("embed_all", "`[[[float]]]`"), ("predict", "`[[{score, label}]]`"),
                            ("tokenize", "`[[{id, text, special, start, stop}]]`"),
                            ("decode", "`[text]`"))),
    ("/v2/embed", "/v2/embed", "Cohere v2 embed: `model`, `texts`, `input_type`, `embedding_types`, "
     "`output_dimension`, `truncate`", "`{id, embeddings: {type: [[...]]}, texts, meta, response_type}`",
     _COHERE_ERRORS),
    ("/api/embed", "/api/embed", "Ollama embed: `model`, `input`, `truncate`, `dimensions`",
     "`{model, embeddings, total_duration, load_duration, prompt_eval_count}`", _OLLAMA_ERRORS),
    ("/api/embeddings", "/api/embeddings", "Ollama's older embeddings: `model`, `prompt`", "`{embedding}`",
     _OLLAMA_ERRORS),
)  # fmt: skip

_KSERVE_ERRORS = "`{error}`; the SIE code in `X-SIE-Error-Code`"
_VERSION = _path_param("version", "The model version: only 1.")
_VERSIONED = "/v2/models/{model:path}/versions/{version}"
# The KServe V2 / Open Inference Protocol (`kserve.py`): (starlette template, OpenAPI path, method, summary, answer).
_KSERVE_ROUTES: Final = (
    ("/v2", "/v2", "get", "Server metadata", "`{name, version, extensions}`"),
    ("/v2/health/live", "/v2/health/live", "get", "Liveness", "`{live}`"),
    ("/v2/health/ready", "/v2/health/ready", "get", "Readiness (503 when not ready)", "`{ready}`"),
    ("/v2/models/{model:path}", "/v2/models/{model}", "get", "Model metadata: its tensors",
     "`{name, versions, platform, inputs, outputs}`"),
    ("/v2/models/{model:path}/ready", "/v2/models/{model}/ready", "get", "Model readiness", "`{name, ready}`"),
    ("/v2/models/{model:path}/infer", "/v2/models/{model}/infer", "post",
     "Inference: BYTES `text` (and `query` to score) in, FP32 `dense` or `scores` out; binary tensor data accepted",
     "`{model_name, model_version, id, outputs}`, or the binary extension"),
    (_VERSIONED, "/v2/models/{model}/versions/{version}", "get", "Model metadata (version 1)",
     "`{name, versions, platform, inputs, outputs}`"),
    (f"{_VERSIONED}/ready", "/v2/models/{model}/versions/{version}/ready", "get", "Model readiness (version 1)",
     "`{name, ready}`"),
    (f"{_VERSIONED}/infer", "/v2/models/{model}/versions/{version}/infer", "post", "Inference (version 1)",
     "`{model_name, model_version, id, outputs}`"),
)  # fmt: skip

# Starlette route template -> OpenAPI path -> method -> operation.
OPERATIONS: Final[Mapping[str, Mapping[str, Mapping[str, Any]]]] = {
    "/v1/encode/{model:path}": {
        "/v1/encode/{model}": {
            "post": _inference("Dense, sparse or multi-vector embeddings", "EncodeRequest", "EncodeResponse")
        }
    },
    "/v1/score/{model:path}": {
        "/v1/score/{model}": {"post": _inference("Rerank items against a query", "ScoreRequest", "ScoreResponse")}
    },
    "/v1/extract/{model:path}": {
        "/v1/extract/{model}": {
            "post": _inference(
                "Entities (and relations, classifications) from items", "ExtractRequest", "ExtractResponse"
            )
        }
    },
    "/v1/embeddings": {
        "/v1/embeddings": {
            "post": _operation(
                "inference",
                "OpenAI-compatible embeddings over encode",
                requestBody=_body("EmbeddingsRequest", ["application/json"]),
                responses={"200": _answer("OpenAI embeddings list"), "400": _answer("OpenAI error envelope")},
            )
        }
    },
    **{
        template: {
            path: {
                "post": _operation(
                    "dialects",
                    summary,
                    requestBody={"content": {"application/json": {"schema": {"type": "object"}}}},
                    responses={"200": _answer(answer), "4XX": _answer(errors), "5XX": _answer(errors)},
                    **({"parameters": [_TEI_MODEL]} if "{model}" in path else {}),
                )
            }
        }
        for template, path, summary, answer, errors in _DIALECT_ROUTES
    },
    "/{model:tei_model}/info": {
        "/{model}/info": {
            "get": _operation(
                "dialects",
                "TEI model information",
                parameters=[_TEI_MODEL],
                responses={
                    "200": _answer("`{model_id, model_type, max_input_length, max_client_batch_size, version}`"),
                    "404": _answer(_TEI_ERRORS),
                },
            )
        }
    },
    **{
        template: {
            path: {
                method: _operation(
                    "kserve",
                    summary,
                    **(
                        {"parameters": [_MODEL, *([_VERSION] if "{version}" in path else [])]}
                        if "{model}" in path
                        else {}
                    ),
                    **(
                        {"requestBody": {"content": {"application/json": {}, "application/octet-stream": {}}}}
                        if method == "post"
                        else {}
                    ),
                    responses={"200": _answer(answer), "4XX": _answer(_KSERVE_ERRORS), "5XX": _answer(_KSERVE_ERRORS)},
                )
            }
        }
        for template, path, method, summary, answer in _KSERVE_ROUTES
    },
    "/v1/generate/{model:path}": {
        "/v1/generate/{model}": {
            "post": _operation(
                "inference",
                "Generate text from a prompt; `stream: true` answers with server-sent events",
                parameters=[_MODEL, *_LANE_HEADERS],
                requestBody=_body("GenerateRequest", ["application/json"]),
                responses={
                    "200": {
                        "description": "`{model, text, finish_reason, usage, attempt_id, ttft_ms, tpot_ms}`, or "
                        "events `{request_id, seq, text_delta, done, ...}` then `[DONE]`",
                        "content": {"application/json": {}, "text/event-stream": {}},
                    },
                    **_OPENAI_ERRORS,
                },
            )
        }
    },
    "/v1/chat/completions": {
        "/v1/chat/completions": {
            "post": _operation(
                "inference",
                "OpenAI-compatible chat completions (text); `stream: true` answers with server-sent events",
                parameters=_LANE_HEADERS,
                requestBody=_body("ChatCompletionRequest", ["application/json"]),
                responses={"200": _answer("`chat.completion`, or `chat.completion.chunk` events"), **_OPENAI_ERRORS},
            )
        }
    },
    "/v1/responses": {
        "/v1/responses": {
            "post": _operation(
                "inference",
                "OpenAI-compatible Responses API (text in, text out, stateless); `stream: true` answers with its "
                "named server-sent events",
                parameters=_LANE_HEADERS,
                requestBody=_body("ResponsesRequest", ["application/json"]),
                responses={"200": _answer("`response`, or `response.*` events"), **_OPENAI_ERRORS},
            )
        }
    },
    "/v1/completions": {
        "/v1/completions": {
            "post": _operation(
                "inference",
                "OpenAI-compatible text completions; `stream: true` answers with server-sent events",
                parameters=_LANE_HEADERS,
                requestBody=_body("CompletionRequest", ["application/json"]),
                responses={"200": _answer("`text_completion`, or its events"), **_OPENAI_ERRORS},
            )
        }
    },
    "/v1/models": {
        "/v1/models": {
            "get": _operation(
                "models",
                "The model catalogue with each model's state",
                responses={"200": _answer("Models", "ModelList")},
            )
        }
    },
    "/v1/models/{model:path}": {
        "/v1/models/{model}": {
            "get": _operation(
                "models",
                "One model",
                parameters=[_MODEL],
                responses={"200": _answer("ModelInfo", "ModelInfo"), "404": _answer("Unknown model", "ErrorEnvelope")},
            )
        }
    },
    "/v1/configs/models": {
        "/v1/configs/models": {
            "get": _operation("config", "Model ids with their config"),
            # The writes are served where the config service runs in process (`--role all`).
            "post": _operation(
                "config",
                "Add a model, or new profiles of one (append-only; admin token)",
                requestBody={"content": {"application/yaml": {"schema": {"type": "string"}}}},
                responses={"201": _answer("Created"), "200": _answer("Profiles added"), "400": _answer("Invalid")},
            ),
        }
    },
    "/v1/configs/models/{model_id:path}": {
        "/v1/configs/models/{model_id}": {
            "get": _operation(
                "config",
                "A model's YAML, or its worker-ack status for an id ending in `/status`",
                parameters=[_path_param("model_id", "Model id, or `{id}/status`.")],
                responses={
                    "200": _answer("YAML (or JSON status)", media="application/yaml"),
                    "404": _answer("Unknown model"),
                },
            ),
            "put": _operation(
                "config",
                "Replace a model's config wholesale (admin token)",
                parameters=[_path_param("model_id", "Model id.")],
                requestBody={"content": {"application/yaml": {"schema": {"type": "string"}}}},
                responses={"200": _answer("Replaced"), "400": _answer("Invalid"), "404": _answer("Unknown model")},
            ),
            "delete": _operation(
                "config",
                "Delete an API-added model (admin token)",
                parameters=[_path_param("model_id", "Model id.")],
                responses={"200": _answer("Deleted"), "404": _answer("Unknown model")},
            ),
        }
    },
    "/v1/configs/epoch": {
        "/v1/configs/epoch": {"get": _operation("config", "The config epoch and the control plane's fingerprints")}
    },
    "/v1/configs/export": {
        "/v1/configs/export": {"get": _operation("config", "Every model's config, what workers reconcile from")}
    },
    "/v1/configs/bundles": {"/v1/configs/bundles": {"get": _operation("config", "Bundles")}},
    "/v1/configs/bundles/{bundle_id}": {
        "/v1/configs/bundles/{bundle_id}": {
            "get": _operation(
                "config",
                "One bundle's YAML",
                parameters=[_path_param("bundle_id", "Bundle name.")],
                responses={"200": _answer("YAML", media="application/yaml"), "404": _answer("Unknown bundle")},
            )
        }
    },
    "/v1/configs/resolve": {
        "/v1/configs/resolve": {
            "post": _operation(
                "config",
                "Which bundle serves the given models",
                requestBody=_body("ResolveRequest", ["application/json"]),
            )
        }
    },
    "/v1/dlq": {
        "/v1/dlq": {
            "get": _operation(
                "dead letters",
                "Dead letters, oldest first",
                description=_ADMIN,
                parameters=[
                    _query_param("after", "Only ids above this (default 0)."),
                    _query_param("limit", "At most this many (default 100)."),
                ],
            )
        }
    },
    "/v1/dlq/purge": {"/v1/dlq/purge": {"post": _operation("dead letters", "Drop every letter", description=_ADMIN)}},
    "/v1/dlq/{letter_id:int}": {
        "/v1/dlq/{letter_id}": {
            "get": _operation(
                "dead letters", "One letter with its work item", description=_ADMIN, parameters=[_LETTER]
            ),
            "delete": _operation("dead letters", "Drop one letter", description=_ADMIN, parameters=[_LETTER]),
        }
    },
    "/v1/dlq/{letter_id:int}/replay": {
        "/v1/dlq/{letter_id}/replay": {
            "post": _operation(
                "dead letters", "Send the letter's work item again", description=_ADMIN, parameters=[_LETTER]
            )
        }
    },
    "/v1/pools": {
        "/v1/pools": {
            "get": _operation("pools", "Every pool: `default`, the static queue pools, the leased ones"),
            "post": _operation(
                "pools",
                "Create a leased pool: `{name, gpus, gpu_caps?, bundle?, queue_pool?, ttl_seconds?, "
                "minimum_worker_count?, pinned_models?}`",
                description=_ADMIN,
                responses={"201": _answer("The new pool"), "200": _answer("The live pool of that name, updated")},
            ),
        }
    },
    "/v1/pools/{name}": {
        "/v1/pools/{name}": {
            "get": _operation("pools", "One pool", parameters=[_POOL]),
            "delete": _operation(
                "pools",
                "Delete a leased pool (`default` and static queue pools: 403)",
                description=_ADMIN,
                parameters=[_POOL],
            ),
        }
    },
    "/v1/pools/{name}/renew": {
        "/v1/pools/{name}/renew": {
            "post": _operation(
                "pools", "Renew a pool's lease by its ttl_seconds", description=_ADMIN, parameters=[_POOL]
            )
        }
    },
    "/v1/scaling/lanes": {
        "/v1/scaling/lanes": {
            "get": _operation(
                "operations", "Scale signals of every lane: pending demand, queue depth, warm floor, workers"
            )
        }
    },
    "/v1/scaling/lanes/{pool}/{machine_profile}/{bundle}": {
        "/v1/scaling/lanes/{pool}/{machine_profile}/{bundle}": {
            "get": _operation(
                "operations",
                "One lane's scale signals, for KEDA's metrics-api scaler (`valueLocation: demand` or `warm_floor`)",
                parameters=[
                    _path_param("pool", "Queue pool."),
                    _path_param("machine_profile", "Machine profile."),
                    _path_param("bundle", "Bundle."),
                ],
            )
        }
    },
    "/v1/placement": {
        "/v1/placement": {"get": _operation("placement", "Worker children, model placement and the policy (seed 002)")}
    },
    "/v1/placement/{rest:path}": {
        "/v1/placement/models/{model}": {
            "post": _operation("placement", "Set a model's replicas, fill mode or fill factor", parameters=[_MODEL])
        },
        "/v1/placement/policy": {"post": _operation("placement", "Change the placement policy")},
        "/v1/placement/repack": {
            "post": _operation(
                "placement",
                "Repack models over the children now",
                parameters=[_query_param("wait", "Seconds to wait for the repack to finish.", "number")],
            )
        },
    },
    "/metrics": {
        "/metrics": {
            "get": _operation(
                "operations", "Prometheus metrics", responses={"200": _answer("Prometheus text", media="text/plain")}
            )
        }
    },
    "/healthz": {
        "/healthz": {
            "get": _operation("operations", "Liveness", responses={"200": _answer("`ok`", media="text/plain")})
        }
    },
    "/readyz": {
        "/readyz": {
            "get": _operation(
                "operations",
                "Readiness",
                responses={
                    "200": _answer("`ok`", media="text/plain"),
                    "503": _answer("`not ready: <why>`", media="text/plain"),
                },
            )
        }
    },
    "/health": {
        "/health": {
            "get": _operation(
                "operations", "Cluster health: workers, models, machine profiles", responses={"200": _answer("Health")}
            )
        }
    },
    "/": {
        "/": {
            "get": _operation(
                "operations",
                "The status page (HTML, for people)",
                responses={"200": _answer("HTML", media="text/html")},
            )
        }
    },
    "/ws/cluster-status": {
        "/ws/cluster-status": {
            "get": _operation(
                "operations",
                "WebSocket: a ClusterStatusMessage JSON text frame about every second",
                responses={"101": _answer("Switching to the WebSocket protocol", "ClusterStatusMessage")},
            )
        }
    },
    "/openapi.json": {"/openapi.json": {"get": _operation("operations", "This description")}},
    "/docs": {
        "/docs": {
            "get": _operation(
                "operations", "This description as a page", responses={"200": _answer("HTML", media="text/html")}
            )
        }
    },
}

_ITEM = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "text": {"type": "string"},
        "images": {"type": "array"},
        "metadata": {"type": "object"},
    },
}
_SCHEMAS: Final = {
    "Item": _ITEM,
    "EncodeRequest": {
        "type": "object",
        "required": ["items"],
        "properties": {
            "items": {"type": "array", "items": _ref("Item"), "minItems": 1},
            "params": {
                "type": "object",
                "properties": {
                    "output_types": {"type": "array", "items": {"enum": ["dense", "sparse", "multivector"]}},
                    "output_dtype": {"enum": ["float32", "float16", "bfloat16", "int8", "uint8", "binary", "ubinary"]},
                    "instruction": {"type": "string"},
                    "options": {"type": "object"},
                },
            },
        },
    },
    "ScoreRequest": {
        "type": "object",
        "required": ["query", "items"],
        "properties": {
            "query": _ref("Item"),
            "items": {"type": "array", "items": _ref("Item"), "minItems": 1},
            "instruction": {"type": "string"},
            "options": {"type": "object"},
        },
    },
    "ExtractRequest": {
        "type": "object",
        "required": ["items"],
        "properties": {
            "items": {"type": "array", "items": _ref("Item"), "minItems": 1},
            "params": {
                "type": "object",
                "properties": {
                    "labels": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1, "maxLength": 128},
                        "description": "What to extract or classify: a zero-shot model (GLiNER, GLiClass, NLI) reads "
                        "these labels with each text and needs them; a fixed-label tagger keeps only its entities of "
                        "these labels. At most SIE_GATEWAY_MAX_LABELS (1000 by default).",
                    },
                    "instruction": {"type": "string", "description": "A GLiClass model's task prompt."},
                    "options": {
                        "type": "object",
                        "description": "threshold; GLiNER: flat_ner, multi_label, max_width, merge_adjacent_entities; "
                        "GLiClass: classification_type, label_groups; NLI: hypothesis_template, multi_label; "
                        "GLiREL: top_k (the labels are relation types, each item's metadata.entities the entities "
                        "related).",
                    },
                },
            },
        },
    },
    "EmbeddingsRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            "encoding_format": {"enum": ["float", "base64"]},
            "dimensions": {"type": "integer"},
        },
    },
    "GenerateRequest": {
        "type": "object",
        "required": ["prompt", "max_new_tokens"],
        "properties": {
            "prompt": {"type": "string"},
            "max_new_tokens": {"type": "integer", "minimum": 1},
            **_SAMPLING_FIELDS,
            "options": {"type": "object"},
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
            "max_tokens": {"type": "integer", "minimum": 1},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            **_SAMPLING_FIELDS,
            "n": {"const": 1},
            "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
            "chat_template_kwargs": {
                "type": "object",
                "description": "the chat template's switches (the model's catalogue entry wins where both set one)",
                "properties": {
                    "enable_thinking": {"type": "boolean"},
                    "guardian_config": {
                        "type": "object",
                        "properties": {"risk_name": {"type": "string", "minLength": 1, "maxLength": 128}},
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
        },
    },
    "CompletionRequest": {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            "model": {"type": "string"},
            "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 1}]},
            "max_tokens": {"type": "integer", "minimum": 1, "default": 16},
            **_SAMPLING_FIELDS,
            "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        },
    },
    "ResponsesRequest": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string"},
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}]},
            "instructions": {"type": "string"},
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "stream": {"type": "boolean"},
        },
    },
    "ResolveRequest": {"type": "object", "properties": {"models": {"type": "array", "items": {"type": "string"}}}},
    "EncodeResponse": {"type": "object", "properties": {"model": {"type": "string"}, "items": {"type": "array"}}},
    "ScoreResponse": {"type": "object", "properties": {"model": {"type": "string"}, "scores": {"type": "array"}}},
    "ExtractResponse": {"type": "object", "properties": {"model": {"type": "string"}, "items": {"type": "array"}}},
    "ModelInfo": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "state": {"enum": ["available", "loading", "loaded", "unloading", "failed"]},
            "loaded": {"type": "boolean"},
            "dims": {"type": "object"},
            "last_error": {"type": ["object", "null"]},
        },
    },
    "ModelList": {"type": "object", "properties": {"models": {"type": "array", "items": _ref("ModelInfo")}}},
    "ErrorEnvelope": {
        "type": "object",
        "properties": {
            "detail": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}
        },
    },
    "ClusterStatusMessage": {
        "type": "object",
        "properties": {
            "timestamp": {"type": "number"},
            "cluster": {"type": "object"},
            "workers": {"type": "array"},
            "models": {"type": "array"},
            "queue": {"type": "object"},
            "traffic": {"type": "object"},
        },
    },
}


def openapi_document(routes: Iterable[tuple[str, Collection[str] | None]]) -> dict[str, Any]:
    """The description of the served `routes` (starlette path templates with their methods; None: every method the
    entry documents) that are documented: each template's operations for the methods served there; a template with
    no entry in OPERATIONS is left out (a test keeps every served route documented)."""
    paths: dict[str, Any] = {}
    for template, methods in routes:
        for path, operations in OPERATIONS.get(template, {}).items():
            served = {
                method: operation
                for method, operation in operations.items()
                if methods is None or method.upper() in methods
            }
            if served:
                paths.setdefault(path, {}).update(served)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "SIE gateway",
            "version": SIE_VERSION,
            "description": "Embeddings, reranking, extraction and text generation served from ONNX models "
            "(seed 000 §14).",
        },
        "paths": paths,
        "components": {"schemas": _SCHEMAS},
    }
