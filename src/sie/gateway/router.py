"""Routing: a model spec, the request's profile and lane headers → the entry, bundle, lane and work subject,
plus every check that can refuse a request before anything is published (seed 000 §2, §16.1–16.3).

Reads a catalog snapshot through a getter and caches routes per snapshot, so a request costs dict lookups.
Pure: no I/O, no web framework.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs

from sie.catalog import Catalog, ModelConfig, parse_model_spec
from sie.catalog.adapters import GLINER2, GLIREL, adapter_kind
from sie.catalog.ids import is_valid_pool_name
from sie.catalog.model import DEFAULT_PROFILE, ENCODE_OUTPUTS
from sie.catalog.names import work_subject
from sie.catalog.options import (
    MAX_OPTION_TEXT_CHARS,
    entities_problem,
    labels_problem,
    muvera_on,
    option_problem,
    structure_problem,
)
from sie.gateway.errors import InvalidRequestError, MachineProfileNotConfiguredError
from sie.gateway.pools import PoolTarget
from sie.settings import LaneSettings
from sie.transport.base import Lane
from sie.wire.http import OUTPUT_DTYPES, EncodeParams, ExtractParams, Item

CatalogSource = Callable[[], Catalog]

UNSEEDED_BUNDLE: Final = "default"
# Routes are cached per catalog snapshot; header values are caller-chosen, so the cache is bounded.
_MAX_CACHED_ROUTES: Final = 4096


@attrs.frozen
class LaneHints:
    """The routing headers as sent: `X-SIE-Pool` and `X-SIE-MACHINE-PROFILE` (which may be `pool/gpu`)."""

    pool: str | None = None
    machine_profile: str | None = None

    def requested_pool(self) -> str | None:
        """The pool the request names: `X-SIE-Pool`, else the `pool/` of a `pool/gpu` machine profile."""
        if self.pool:
            return self.pool
        if self.machine_profile and "/" in self.machine_profile:
            return self.machine_profile.split("/", 1)[0] or None
        return None

    def requested_machine_profile(self) -> str | None:
        """The machine profile the request names, without a `pool/` prefix."""
        profile = self.machine_profile
        if profile and "/" in profile:
            profile = profile.split("/", 1)[1]
        return profile or None


@attrs.frozen
class Route:
    """Where one request's work goes and what the model behind it can do."""

    model: str  # the id the response names: the path's catalogue entry
    model_id: str  # the entry the work is for (a `model:profile` variant when options.profile chose one)
    profile: str
    bundle: str
    lane: Lane
    subject: str
    config: ModelConfig | None  # None only for the unseeded fallback (empty catalogue)
    default_outputs: tuple[str, ...] = ("dense",)
    # The profile's runtime options ask for MUVERA's dense encoding of a multi-vector model (its `muvera` profile).
    muvera: bool = False
    # The profile's kind of adapter (`sie.catalog.adapters`): which options the model reads; None when unknown.
    adapter_kind: str | None = None
    # The expected bundle_config_hash of (bundle, lane pool) in the snapshot this route was resolved from;
    # "" when that scope has no routable models (legacy: workers accept unhashed work).
    bundle_config_hash: str = ""
    # The logical pool the request named (the work items' `admission_pool`); None when it named none.
    admission_pool: str | None = None
    # The lanes whose demand a PROVISIONING answer records: the route's, or every machine profile of the named
    # pool when the request named none (seed 000 §16.3: multi-profile pools wake every candidate lane).
    demand_lanes: tuple[Lane, ...] = ()


class Router:
    """Resolves requests against the current catalog snapshot; the snapshot is read once per request.

    `defaults` is the lane of requests that name none; `configured_machine_profiles` (SIE_GATEWAY_CONFIGURED_GPUS),
    when not empty, are the only machine profiles a request may name.
    """

    def __init__(
        self, catalog: CatalogSource, defaults: LaneSettings, configured_machine_profiles: tuple[str, ...] = ()
    ) -> None:
        self._catalog = catalog
        self._defaults = defaults
        self._configured = configured_machine_profiles
        self._snapshot: Catalog | None = None
        self._routes: dict[tuple[str, str | None, str | None, str | None], Route] = {}
        self._hashes: dict[tuple[str, str], str] = {}

    def route(self, spec: str, profile: Any, hints: LaneHints, target: PoolTarget | None = None) -> Route:
        """The route for `spec` with `options.profile`, to the named pool's `target` (None: the request named
        none); raises ModelNotFoundError, BundleConflictError or InvalidRequestError (unknown profile, bad lane
        header)."""
        if profile is not None and not isinstance(profile, str):
            raise InvalidRequestError("Field 'options.profile' must be a string")
        catalog = self._catalog()
        if catalog is not self._snapshot:
            self._snapshot, self._routes, self._hashes = catalog, {}, {}
        key = (spec, profile, target, hints.requested_machine_profile())
        route = self._routes.get(key)
        if route is None:
            route = self._resolve(catalog, spec, profile, hints.requested_machine_profile(), target)
            route = attrs.evolve(route, bundle_config_hash=self._expected_hash(catalog, route))
            if len(self._routes) >= _MAX_CACHED_ROUTES:
                self._routes.clear()
            self._routes[key] = route
        return route

    def _expected_hash(self, catalog: Catalog, route: Route) -> str:
        """The pool-scoped hash a worker of the route's lane must hold (seed 000 §2, §7); cached per snapshot."""
        key = (route.bundle, route.lane.pool)
        digest = self._hashes.get(key)
        if digest is None:
            digest = expected_bundle_config_hash(catalog, route.bundle, route.lane.pool)
            self._hashes[key] = digest
        return digest

    def _resolve(
        self, catalog: Catalog, spec: str, profile: str | None, machine_profile: str | None, target: PoolTarget | None
    ) -> Route:
        parsed = parse_model_spec(spec)
        if not catalog.models:
            # Seed 000 §2: an unseeded gateway still publishes to the caller's bundle (or `default`).
            bundle = parsed.bundle or UNSEEDED_BUNDLE
            return self._route(parsed.model_id, parsed.model_id, DEFAULT_PROFILE, bundle, None, machine_profile, target)
        resolution = catalog.resolve(spec)
        named, model = resolution.entry.model_id, resolution.entry.model
        if profile is not None and profile != resolution.entry.profile:
            if profile not in model.profiles:
                raise InvalidRequestError(f"Profile '{profile}' not found. Available: {sorted(model.profiles)}")
            variant = model.sie_id if profile == DEFAULT_PROFILE else f"{model.sie_id}:{profile}"
            resolution = catalog.resolve(variant, parsed.bundle)
        entry = resolution.entry
        route = self._route(
            named, entry.model_id, entry.profile, resolution.bundle.name, model, machine_profile, target
        )
        resolved = model.resolve_profile(entry.profile)
        return attrs.evolve(route, default_outputs=_default_outputs(model, entry.profile),
                            muvera=muvera_on(resolved.runtime_options.get("muvera")),
                            adapter_kind=adapter_kind(resolved.adapter_path))  # fmt: skip

    def _route(  # noqa: PLR0913 - the resolved parts of one route
        self,
        model: str,
        model_id: str,
        profile: str,
        bundle: str,
        config: ModelConfig | None,
        machine_profile: str | None,
        target: PoolTarget | None,
    ) -> Route:
        if target is not None:
            pool = target.queue_pool
        else:
            pool = _lane_token("pool", (config.pool if config is not None else None) or self._defaults.pool)
        if machine_profile:
            profiles = (self._machine_profile(machine_profile),)
        elif target is not None and target.machine_profiles:
            # A pool names the machine profiles it wants: work goes to the first, demand wakes every one of them.
            profiles = target.machine_profiles
            default = self._defaults.machine_profile
            if default in profiles:
                profiles = (default, *(candidate for candidate in profiles if candidate != default))
        else:
            profiles = (_lane_token("machine profile", self._defaults.machine_profile),)
        lane = Lane(pool, profiles[0], bundle)
        subject = work_subject(pool, lane.machine_profile, bundle, model_id)
        demand_lanes = tuple(Lane(pool, candidate, bundle) for candidate in profiles)
        admission_pool = target.logical if target is not None else None
        return Route(model, model_id, profile, bundle, lane, subject, config, admission_pool=admission_pool,
                     demand_lanes=demand_lanes)  # fmt: skip

    def _machine_profile(self, requested: str) -> str:
        token = _lane_token("machine profile", requested)
        if self._configured and token not in self._configured:
            raise MachineProfileNotConfiguredError(token, self._configured)
        return token


def expected_bundle_config_hash(catalog: Catalog, bundle: str, pool: str) -> str:
    """`bundle_config_hash(bundle, pool)` of `catalog`; "" for a bundle the catalogue does not know."""
    if bundle not in catalog.bundles:
        return ""
    return catalog.bundle_config_hash(bundle, pool)


def _lane_token(kind: str, value: str) -> str:
    # Seed 000 §16.3: lane tokens are trimmed, lower-cased and limited to [A-Za-z0-9_-].
    token = value.strip().lower()
    if not is_valid_pool_name(token):
        raise InvalidRequestError(f"Invalid {kind} '{value}': expected 1-128 characters of [A-Za-z0-9_-]")
    return token


def _default_outputs(model: ModelConfig, profile: str) -> tuple[str, ...]:
    """A profile's `output_types` runtime option, else dense, else the model's first encode output."""
    configured = model.resolve_profile(profile).runtime_options.get("output_types")
    if isinstance(configured, list) and configured and all(isinstance(kind, str) for kind in configured):
        return tuple(configured)
    encode = [kind for kind in ENCODE_OUTPUTS if kind in model.tasks.encode]
    return ("dense",) if not encode or "dense" in encode else (encode[0],)


def _set_text(names: Sequence[str]) -> str:
    return "{" + ", ".join(repr(name) for name in sorted(names)) + "}"


def encode_outputs(route: Route, requested: list[str] | None, options: dict[str, Any] | None = None) -> list[str]:
    """The output types to compute: the request's, else the route's default; each must be a model output, or a
    multi-vector model's `dense` MUVERA encoding when the request's options (else the profile's) turn it on."""
    wanted = list(requested) if requested else list(route.default_outputs)
    if route.config is None:
        return wanted
    supported = list(route.config.tasks.encode)
    muvera = muvera_on(options["muvera"]) if isinstance(options, dict) and "muvera" in options else route.muvera
    if muvera and "multivector" in supported and "dense" not in supported:
        supported.append("dense")
    if not supported:
        raise InvalidRequestError(f"Model '{route.model}' does not support encoding")
    unsupported = [kind for kind in wanted if kind not in supported]
    if unsupported:
        raise InvalidRequestError(
            f"Model '{route.model}' does not support output types: {_set_text(unsupported)}. "
            f"Supported: {_set_text(list(supported))}"
        )
    return wanted


def check_output_dtype(params: EncodeParams | None) -> None:
    """`params.output_dtype` must be a dtype SIE serves (wire.http.OUTPUT_DTYPES), refused here, before anything
    is queued (the `output_dtype` option is checked with the other options)."""
    dtype = params.output_dtype if params is not None else None
    if dtype is not None and dtype not in OUTPUT_DTYPES:
        raise InvalidRequestError(f"Unsupported output_dtype {dtype!r}. Supported: {list(OUTPUT_DTYPES)}")


def check_options(route: Route, options: dict[str, Any] | None, operation: str, instruction: str | None) -> None:
    """The request's options must be ones the route's model reads, with values they allow, and its
    instruction of a sane length (`sie.catalog.options`): refused here, for this request alone, instead of
    failing the batch it would share with others."""
    if instruction is not None and len(instruction) > MAX_OPTION_TEXT_CHARS:
        raise InvalidRequestError(
            f"Field 'instruction' has {len(instruction)} characters; at most {MAX_OPTION_TEXT_CHARS} are accepted"
        )
    problem = option_problem(options, route.adapter_kind, operation)
    if problem is not None:
        raise InvalidRequestError(problem)


def check_inputs(route: Route, items: Sequence[Item]) -> None:
    """Images reach only a model whose YAML says it reads them (`inputs.image`): refused here, naming the first item
    that carries one, instead of being silently dropped by a text model."""
    if route.config is None or route.config.inputs.get("image"):
        return
    for index, item in enumerate(items):
        if item.images:
            raise InvalidRequestError(
                f"Item {index} carries images, but model '{route.model}' reads no images (its inputs: "
                f"{sorted(name for name, read in route.config.inputs.items() if read)})"
            )


def check_score(route: Route) -> None:
    """Scoring needs `tasks.score` (checked before anything is published)."""
    if route.config is not None and not route.config.tasks.score:
        raise InvalidRequestError(f"Model '{route.model}' does not support scoring")


def check_extract(route: Route, params: ExtractParams | None, max_labels: int, items: Sequence[Item] = ()) -> None:
    """Extraction needs `tasks.extract`; its results hold no vectors, so an `output_dtype` is refused; its labels
    must be at most `max_labels` sane strings, and present for a zero-shot model, unless an `output_schema` (which a
    GLiNER2 model fills) asks for fields instead; a relation extractor's items must name their entities
    (`metadata.entities`) within their texts (`sie.catalog.options`)."""
    if route.config is not None and not route.config.tasks.extract:
        raise InvalidRequestError(f"Model '{route.model}' does not support extraction")
    labels, options = (params.labels, params.options) if params is not None else (None, None)
    if params is not None and params.output_schema is not None:
        problem = structure_problem(params.output_schema, labels, route.adapter_kind, max_labels, options)
    else:
        problem = labels_problem(labels, route.adapter_kind, max_labels, options)
    if problem is not None:
        raise InvalidRequestError(problem)
    if params is not None and params.output_dtype is not None:
        raise InvalidRequestError(
            f"Field 'output_dtype' does not apply to extraction: model '{route.model}' returns no vectors"
        )
    # A relation extractor reads the entities each item names: GLiREL always, GLiNER2 where an item names some.
    if route.adapter_kind in (GLIREL, GLINER2):
        for index, item in enumerate(items):
            entities = (item.metadata or {}).get("entities")
            if entities is None and route.adapter_kind == GLINER2:
                continue
            problem = entities_problem(item.text or "", entities)
            if problem is not None:
                raise InvalidRequestError(f"Item {index}: {problem}")
