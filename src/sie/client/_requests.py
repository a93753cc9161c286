"""Request bodies, paths and routing headers exactly as sie-sdk 0.10.1 sends them (contracts Part A §2.5, Part B §2.2).

Pure: builds plain maps for `sie.wire.packb`; sending them is the clients' job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

from sie.client._retry import DEFAULT_MAX_OOM_RETRIES, RetryPolicy

T = TypeVar("T")

MSGPACK = "application/msgpack"
JSON = "application/json"
MACHINE_PROFILE_HEADER = "X-SIE-MACHINE-PROFILE"
POOL_HEADER = "X-SIE-Pool"
SDK_VERSION_HEADER = "X-SIE-SDK-Version"
MODEL_REVISION_HEADER = "X-SIE-Model-Revision"


@attrs.frozen(kw_only=True)
class EncodeParams:
    """The body parameters of one encode call."""

    output_types: Sequence[str] | None = None
    instruction: str | None = None
    output_dtype: str | None = None
    is_query: bool | None = None
    options: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ScoreParams:
    """The body parameters of one score call."""

    instruction: str | None = None
    options: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ExtractParams:
    """The body parameters of one extract call."""

    labels: Sequence[str] | None = None
    output_schema: Mapping[str, Any] | None = None
    instruction: str | None = None
    options: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class CallKnobs:
    """Routing and retry knobs of one inference call; `gpu=None` means the client's default."""

    gpu: str | None = None
    wait_for_capacity: bool = True
    provision_timeout_s: float | None = None
    max_oom_retries: int = DEFAULT_MAX_OOM_RETRIES


@attrs.frozen(kw_only=True)
class Call(Generic[T]):
    """One API call, ready for a driver: what to send, how to retry, and how to read the answer."""

    method: str
    path: str
    headers: Mapping[str, str]
    policy: RetryPolicy
    parse: Callable[[dict[str, Any]], T]
    what: str
    content: bytes | None = None
    # Seconds to wait for the answer, as given (generation's per-call `read_timeout_s`); None: the client's,
    # capped by what is left of the budget.
    read_timeout_s: float | None = None
    # Whether each result gets the request's id and metered units as `request` (inference calls, as sie-sdk does).
    request_metadata: bool = False


def merge_options(
    defaults: Mapping[str, Any] | None, per_call: Mapping[str, Any] | None, *, is_query: bool | None = None
) -> dict[str, Any] | None:
    """Client options under per-call options (per-call wins), with `is_query` folded in; None when neither is set."""
    if defaults is None and per_call is None and is_query is None:
        return None
    merged = {**(defaults or {}), **(per_call or {})}
    if is_query is not None:
        merged["is_query"] = is_query
    return merged


def _without_none(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def _listed(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)


def encode_body(items: list[Any], params: EncodeParams, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`{"items", "params"?: {output_types?, instruction?, output_dtype?, options?}}`; `params` only when non-empty."""
    body: dict[str, Any] = {"items": items}
    fields = _without_none(
        output_types=_listed(params.output_types),
        instruction=params.instruction,
        output_dtype=params.output_dtype,
        options=options,
    )
    if fields:
        body["params"] = fields
    return body


def score_body(query: Any, items: list[Any], params: ScoreParams, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`{"query", "items", "instruction"?, "options"?}`, all at the top level."""
    return {"query": query, "items": items, **_without_none(instruction=params.instruction, options=options)}


def extract_body(items: list[Any], params: ExtractParams, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`{"items", "params"?: {labels?, output_schema?, instruction?, options?}}`; `params` only when non-empty."""
    body: dict[str, Any] = {"items": items}
    fields = _without_none(
        labels=_listed(params.labels),
        output_schema=params.output_schema,
        instruction=params.instruction,
        options=options,
    )
    if fields:
        body["params"] = fields
    return body


def as_item_list(items: Any) -> tuple[list[Any], bool]:
    """The items as a list, and whether the caller passed a single item (then one result comes back, not a list)."""
    if isinstance(items, list):
        return items, False
    return [items], True


def routing_headers(gpu: str | None) -> dict[str, str]:
    """`gpu="pool/l4"` → machine profile `l4` in pool `pool`; `gpu="l4"` → the machine profile alone."""
    if not gpu:
        return {}
    pool, _, profile = gpu.partition("/") if "/" in gpu else ("", "", gpu)
    headers = {MACHINE_PROFILE_HEADER: profile} if profile else {}
    if pool:
        headers[POOL_HEADER] = pool
    return headers


def lora_of(options: Mapping[str, Any] | None) -> str | None:
    """The LoRA adapter a call asks for, named in LoraLoadingError."""
    lora = (options or {}).get("lora") or (options or {}).get("lora_id")
    return str(lora) if lora else None
