"""Hostile requests sent among innocent ones against a running gateway (issue 14 §1): every hostile request must
be refused for itself with a 4xx that leaks nothing internal, and every innocent request sent at the same time
must get exactly the vectors it gets alone.

The hostile requests are the issue's reproductions and their relatives: malformed or inapplicable options (which
used to fail every request batched with them, or be redelivered for minutes), bodies with bytes after their
msgpack object or nested too deep, and a machine profile no capacity can come for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import attrs
import httpx
import msgpack
import numpy as np

MINILM: Final = "sentence-transformers/all-MiniLM-L6-v2"
RAMPART: Final = "nationaldesignstudio/rampart"
ENCODE_PATH: Final = f"/v1/encode/{MINILM}"
JSON_TYPE: Final = {"content-type": "application/json"}
MSGPACK_TYPE: Final = {"content-type": "application/msgpack"}
# Text that must never reach a caller: a traceback, a source path, the ONNX Runtime's own messages, raw Python errors.
LEAKS: Final = ("Traceback", 'File "', "/src/sie", ".py", "site-packages", "onnxruntime_src", "[ONNXRuntimeError]",
                "ValueError", "TypeError", "AttributeError", "KeyError")  # fmt: skip


@attrs.frozen
class Hostile:
    """One hostile request: what it is, where it goes, its bytes and headers."""

    name: str
    path: str
    content: bytes
    headers: dict[str, str]


def _json(name: str, body: Any, path: str = ENCODE_PATH, **headers: str) -> Hostile:
    return Hostile(name, path, json.dumps(body).encode(), {**JSON_TYPE, **headers})


def _options(name: str, options: dict[str, Any]) -> Hostile:
    return _json(name, {"items": [{"text": "a"}], "params": {"options": options}})


HOSTILE: Final[tuple[Hostile, ...]] = (
    _options("template that is an object", {"doc_template": {"a": 1}}),
    _options("unknown pooling", {"pooling": "max"}),
    _options("normalize that is a list", {"normalize": []}),
    _options("normalize that is a map", {"normalize": {}}),
    _options("is_query that is a string", {"is_query": "yes"}),
    _options("template repeating its text", {"query_template": "{text}" * 50, "is_query": True}),
    _options("output_dtype option SIE does not serve", {"output_dtype": "bfloat16"}),
    _options("output_types option that is a string", {"output_types": "dense"}),
    _options("a LoRA adapter", {"lora_id": "my-adapter"}),
    _options("an extraction threshold on an embedding model", {"threshold": 0.5}),
    _json("an instruction of 5000 characters", {"items": [{"text": "a"}], "params": {"instruction": "i" * 5000}}),
    _json("pooling when scoring", {"query": {"text": "q"}, "items": [{"text": "d"}], "options": {"pooling": "cls"}},
          path=f"/v1/score/{MINILM}"),
    _json("output_dtype on extraction", {"items": [{"text": "Ada"}], "params": {"output_dtype": "int8"}},
          path=f"/v1/extract/{RAMPART}"),
    _json("a machine profile no capacity can come for", {"items": [{"text": "a"}]},
          **{"x-sie-machine-profile": "nonesuch"}),
    Hostile("msgpack with trailing bytes", ENCODE_PATH, msgpack.packb({"items": [{"text": "a"}]}) + b"\x01\x02",
            MSGPACK_TYPE),
    Hostile("JSON nested 5000 deep", ENCODE_PATH,
            b'{"items":[{"text":"a","metadata":{"x":' + b"[" * 5000 + b"]" * 5000 + b"}}]}", JSON_TYPE),
)  # fmt: skip

INNOCENT_TEXTS: Final = tuple(f"an innocent sentence number {index}" for index in range(5))


@attrs.frozen
class Outcome:
    """What one request got: its status, its body (decoded JSON) and which request it was."""

    name: str
    status: int
    body: Any


def _innocent_body(index: int) -> bytes:
    return json.dumps({"items": [{"text": INNOCENT_TEXTS[index % len(INNOCENT_TEXTS)]}]}).encode()


def references(client: httpx.Client) -> list[np.ndarray]:
    """Each innocent text's vector, encoded alone before the crowd arrives."""
    vectors = []
    for index in range(len(INNOCENT_TEXTS)):
        response = client.post(ENCODE_PATH, content=_innocent_body(index), headers=JSON_TYPE)
        assert response.status_code == 200, response.text
        vectors.append(np.asarray(response.json()["items"][0]["dense"]["values"], dtype=np.float32))
    return vectors


def send_crowd(base_url: str, innocent: int, rounds_of_hostile: int, threads: int = 8) -> list[Outcome]:
    """`innocent` good encodes interleaved with `rounds_of_hostile` passes over HOSTILE, sent from `threads`
    threads at once so hostile and innocent requests share the server's batches."""
    plan: list[tuple[str, str, bytes, dict[str, str]]] = []
    hostile = [hostile for _ in range(rounds_of_hostile) for hostile in HOSTILE]
    for index in range(max(innocent, len(hostile))):
        if index < innocent:
            plan.append((f"innocent-{index}", ENCODE_PATH, _innocent_body(index), JSON_TYPE))
        if index < len(hostile):
            case = hostile[index]
            plan.append((case.name, case.path, case.content, case.headers))
    with httpx.Client(base_url=base_url, timeout=120.0) as client, ThreadPoolExecutor(threads) as pool:

        def send(request: tuple[str, str, bytes, dict[str, str]]) -> Outcome:
            name, path, content, headers = request
            response = client.post(path, content=content, headers=headers)
            try:
                body = response.json()
            except ValueError:
                body = response.text
            return Outcome(name, response.status_code, body)

        return list(pool.map(send, plan))


def innocent_failures(outcomes: Sequence[Outcome], expected: Sequence[np.ndarray]) -> list[str]:
    """Every innocent request that did not get its reference vector (close to 1e-4: batching pads differently)."""
    failures = []
    for outcome in outcomes:
        if not outcome.name.startswith("innocent-"):
            continue
        index = int(outcome.name.rsplit("-", 1)[1])
        if outcome.status != 200:
            failures.append(f"{outcome.name}: {outcome.status} {str(outcome.body)[:300]}")
            continue
        values = np.asarray(outcome.body["items"][0]["dense"]["values"], dtype=np.float32)
        if not np.allclose(values, expected[index % len(expected)], atol=1e-4):
            failures.append(f"{outcome.name}: a different vector")
    return failures


def hostile_misanswers(outcomes: Sequence[Outcome]) -> list[str]:
    """Every hostile request not refused with a 400 whose body names no internal detail."""
    wrong = []
    for outcome in outcomes:
        if outcome.name.startswith("innocent-"):
            continue
        text = json.dumps(outcome.body) if not isinstance(outcome.body, str) else outcome.body
        leaked = [leak for leak in LEAKS if leak in text]
        if outcome.status != 400 or leaked:
            wrong.append(f"{outcome.name}: {outcome.status} {text[:300]} (leaks: {leaked})")
    return wrong
