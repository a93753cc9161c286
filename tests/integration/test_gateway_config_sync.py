"""Gateway config sync against a stand-in config service: a small starlette app serving the 0.10.1 shapes of
`/epoch`, `/bundles`, `/bundles/{id}` and `/export` from a Catalog (contracts Part A §2.4), reached through the
real httpx client over ASGITransport (seed 000 §4.1, §4.2).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sie.catalog import Catalog, dump_yaml, parse_bundle, parse_model_config
from sie.gateway.config_sync import (
    BackoffPolicy,
    Bootstrap,
    ConfigServiceClient,
    ConfigServiceError,
    ConfigState,
    ModelSource,
    PartialApplyError,
    Poller,
    PollOutcome,
    StateRealigner,
)
from support.polling import eventually

ADAPTER = "sie.adapters.dense:DenseAdapter"


def bundle(name: str, priority: int = 10, adapters: tuple[str, ...] = ("sie.adapters.dense",)) -> Any:
    return parse_bundle({"name": name, "priority": priority, "adapters": list(adapters)})


def model_data(sie_id: str, pool: str | None = None, tokens: int = 512) -> dict[str, Any]:
    data: dict[str, Any] = {
        "sie_id": sie_id,
        "hf_id": sie_id,
        "profiles": {"default": {"adapter_path": ADAPTER, "max_batch_tokens": tokens}},
    }
    if pool:
        data["pool"] = pool
    return data


def model(sie_id: str, **kwargs: Any) -> Any:
    return parse_model_config(model_data(sie_id, **kwargs))


class ConfigService:
    """The stand-in: serves `catalog` at `epoch`; `failing` paths answer 503; `extra_rows` join the export."""

    def __init__(self, catalog: Catalog, epoch: int = 0) -> None:
        self.catalog = catalog
        self.epoch = epoch
        self.hash_overrides: dict[str, str] = {}
        self.failing: set[str] = set()
        self.extra_rows: list[Any] = []
        self.calls: list[str] = []
        self.auth: list[str | None] = []
        self.app = Starlette(
            routes=[
                Route("/v1/configs/epoch", self.get_epoch),
                Route("/v1/configs/bundles", self.list_bundles),
                Route("/v1/configs/bundles/{bundle_id}", self.get_bundle),
                Route("/v1/configs/export", self.export),
            ]
        )

    def _seen(self, request: Request) -> Response | None:
        self.calls.append(request.url.path)
        self.auth.append(request.headers.get("authorization"))
        if request.url.path in self.failing:
            return JSONResponse({"detail": {"error": "registry_unavailable"}}, status_code=503)
        return None

    async def get_epoch(self, request: Request) -> Response:
        body = {
            "epoch": self.epoch,
            "bundles_hash": self.catalog.bundles_hash,
            "bundle_config_hashes_hash": self.catalog.bundle_config_hashes_hash,
        }
        return self._seen(request) or JSONResponse({**body, **self.hash_overrides})

    async def list_bundles(self, request: Request) -> Response:
        rows = [
            {"bundle_id": b.name, "engine": b.engine, "priority": b.priority, "adapter_count": len(b.adapters),
             "source": "filesystem"}
            for b in self.catalog.bundles_by_priority
        ]  # fmt: skip
        return self._seen(request) or JSONResponse({"bundles": rows})

    async def get_bundle(self, request: Request) -> Response:
        b = self.catalog.bundles[request.path_params["bundle_id"]]
        text = dump_yaml({"adapters": list(b.adapters), "engine": b.engine, "name": b.name,
                          "priority": b.priority, "source": "filesystem"})  # fmt: skip
        return self._seen(request) or Response(text, media_type="application/x-yaml")

    async def export(self, request: Request) -> Response:
        rows = [
            {"model_id": m.sie_id, "model_config": dict(m.raw), "raw_yaml": dump_yaml(dict(m.raw)),
             "affected_bundles": [b.name for b in self.catalog.model_bundles(m)], "pool": m.effective_pool,
             "source": "api"}
            for m in self.catalog.models.values()
        ]  # fmt: skip
        body = {
            "snapshot_version": 1,
            "epoch": self.epoch,
            "generated_at": "2026-01-01T00:00:00+00:00",
            "bundle_config_hashes": self.catalog.bundle_config_hashes,
            "bundle_pool_config_hashes": self.catalog.bundle_pool_config_hashes,
            "bundle_adapters": {b: list(x.adapters) for b, x in self.catalog.bundles.items()},
            "models": rows + self.extra_rows,
        }
        return self._seen(request) or JSONResponse(body)


@pytest.fixture()
def service() -> ConfigService:
    return ConfigService(Catalog([bundle("default"), bundle("fast", 5)], [model("org/a"), model("org/b")]), epoch=3)


@pytest.fixture()
def state() -> ConfigState:
    return ConfigState(Catalog([bundle("default")], [model("seed/model")]))


@pytest.fixture()
async def realigner(service: ConfigService, state: ConfigState):
    client = ConfigServiceClient.create("http://config/", "s3cret", transport=httpx.ASGITransport(app=service.app))
    async with client:
        yield StateRealigner(client, state)


def metric(state: ConfigState, name: str, **labels: str) -> float | None:
    """One sample of the state's telemetry, read back from its Prometheus exposition; None when absent."""
    for family in text_string_to_metric_families(state.telemetry.prometheus_text().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def operations(state: ConfigState, operation: str, outcome: str) -> float | None:
    return metric(state, "sie_gateway_config_operations_total", operation=operation, outcome=outcome)


class FakeTime:
    """An injected clock whose sleep advances it; records every sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --- bootstrap_once ---------------------------------------------------------------------------------------


async def test_bootstrap_reads_epoch_before_bundles_then_export_with_the_admin_bearer(
    service: ConfigService, state: ConfigState, realigner: StateRealigner
) -> None:
    outcome = await realigner.bootstrap_once()
    assert service.calls == [
        "/v1/configs/epoch", "/v1/configs/bundles", "/v1/configs/bundles/fast", "/v1/configs/bundles/default",
        "/v1/configs/export",
    ]  # fmt: skip
    assert set(service.auth) == {"Bearer s3cret"}
    assert (outcome.epoch, outcome.applied, outcome.total) == (3, 2, 2)
    assert sorted(state().models) == ["org/a", "org/b"]  # the export replaces the seed
    assert sorted(state().bundles) == ["default", "fast"]
    assert state.epoch.get() == 3
    assert state.bundles_hash == service.catalog.bundles_hash
    assert state.bundle_config_hashes_hash == service.catalog.bundle_config_hashes_hash
    assert state.source("org/a") is ModelSource.API


async def test_no_token_sends_no_authorization_header(service: ConfigService) -> None:
    client = ConfigServiceClient.create("http://config", None, transport=httpx.ASGITransport(app=service.app))
    async with client:
        await client.epoch()
    assert service.auth == [None]


@pytest.mark.parametrize(
    "bad_row",
    [
        {"model_id": "x/bad", "model_config": "sie_id: [unclosed"},
        {"model_id": "x/nohf", "model_config": {"sie_id": "x/nohf", "profiles": {}}},
        {"model_id": "x/unroutable", "model_config": {**model_data("x/unroutable"), "profiles": {
            "default": {"adapter_path": "other.pkg:Adapter", "max_batch_tokens": 8}}}},
        "not an object",
    ],
)  # fmt: skip
async def test_partial_apply_advances_nothing_and_keeps_the_model_set(
    service: ConfigService, state: ConfigState, realigner: StateRealigner, bad_row: Any
) -> None:
    service.extra_rows = [bad_row]
    with pytest.raises(PartialApplyError) as raised:
        await realigner.bootstrap_once()
    assert (raised.value.failed, raised.value.total) == (1, 3)
    assert list(state().models) == ["seed/model"]
    assert state.epoch.get() == 0
    assert (state.bundles_hash, state.bundle_config_hashes_hash) == ("", "")


async def test_export_rows_without_a_body_are_skipped_not_failed(
    service: ConfigService, state: ConfigState, realigner: StateRealigner
) -> None:
    service.extra_rows = [{"model_id": "x/empty", "model_config": None, "raw_yaml": ""}]
    outcome = await realigner.bootstrap_once()
    assert (outcome.applied, outcome.total) == (2, 3)
    assert "x/empty" not in state().models


async def test_raw_yaml_string_bodies_are_parsed(service: ConfigService, state: ConfigState, realigner: StateRealigner):
    service.extra_rows = [{"model_id": "y/yaml", "raw_yaml": dump_yaml(model_data("y/yaml")), "source": "filesystem"}]
    await realigner.bootstrap_once()
    assert "y/yaml" in state().models
    assert state.source("y/yaml") is ModelSource.FILESYSTEM


# --- the retry loop ---------------------------------------------------------------------------------------


async def test_no_service_url_returns_at_once() -> None:
    bootstrap = Bootstrap(None)
    assert await bootstrap.run() is None
    assert bootstrap.attempts == 0


async def test_backoff_doubles_to_the_cap_and_degraded_after_ten_failures_then_clears(
    service: ConfigService, state: ConfigState, realigner: StateRealigner
) -> None:
    time = FakeTime()
    service.failing = {"/v1/configs/epoch"}
    degraded_at: list[bool] = []

    async def sleep(seconds: float) -> None:
        degraded_at.append(state.degraded)
        if len(time.sleeps) == 11:
            service.failing = set()
        await time.sleep(seconds)

    bootstrap = Bootstrap(realigner, BackoffPolicy(degraded_after_s=1e9), clock=time.clock, sleep=sleep)
    outcome = await bootstrap.run()
    assert outcome is not None and outcome.epoch == 3
    assert time.sleeps == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]
    assert degraded_at == [False] * 9 + [True] * 3
    assert state.degraded is False
    assert bootstrap.attempts == 13


async def test_bootstrap_metrics_degraded_gauge_after_ten_failures_cleared_on_success(
    service: ConfigService, state: ConfigState, realigner: StateRealigner
) -> None:
    time = FakeTime()
    service.failing = {"/v1/configs/epoch"}
    gauge_at: list[float | None] = []

    async def sleep(seconds: float) -> None:
        gauge_at.append(metric(state, "sie_gateway_config_bootstrap_degraded"))
        if len(time.sleeps) == 9:
            service.failing = set()
        await time.sleep(seconds)

    assert metric(state, "sie_gateway_config_bootstrap_degraded") == 0.0
    assert metric(state, "sie_gateway_config_applied_epoch") == 0.0
    await Bootstrap(realigner, BackoffPolicy(degraded_after_s=1e9), clock=time.clock, sleep=sleep).run()
    assert gauge_at == [0.0] * 9 + [1.0]
    assert metric(state, "sie_gateway_config_bootstrap_degraded") == 0.0
    assert operations(state, "bootstrap", "failure") == 10.0
    assert operations(state, "bootstrap", "success") == 1.0
    assert operations(state, "export", "success") == 1.0
    assert metric(state, "sie_gateway_config_applied_epoch") == 3.0


async def test_partial_bootstrap_and_export_are_recorded_as_partial(
    service: ConfigService, state: ConfigState, realigner: StateRealigner
) -> None:
    service.extra_rows = ["not an object"]

    async def sleep(seconds: float) -> None:
        service.extra_rows = []

    await Bootstrap(realigner, sleep=sleep).run()
    assert operations(state, "bootstrap", "partial") == 1.0
    assert operations(state, "export", "partial") == 1.0
    assert operations(state, "bootstrap", "success") == 1.0


async def test_applied_epoch_follows_set_max_and_force_set(state: ConfigState) -> None:
    state.epoch.set_max(7)
    assert metric(state, "sie_gateway_config_applied_epoch") == 7.0
    state.epoch.set_max(4)
    assert metric(state, "sie_gateway_config_applied_epoch") == 7.0
    state.epoch.force_set(2)
    assert metric(state, "sie_gateway_config_applied_epoch") == 2.0


async def test_degraded_after_five_minutes_of_failure(service: ConfigService, state: ConfigState, realigner):
    time = FakeTime()
    service.failing = {"/v1/configs/export"}
    policy = BackoffPolicy(initial_s=100.0, cap_s=100.0)

    async def sleep(seconds: float) -> None:
        if time.now >= 300:
            service.failing = set()
        await time.sleep(seconds)

    seen: list[bool] = []
    original = realigner.bootstrap_once

    async def observed() -> Any:
        seen.append(state.degraded)
        return await original()

    realigner.bootstrap_once = observed  # type: ignore[method-assign]
    await Bootstrap(realigner, policy, clock=time.clock, sleep=sleep).run()
    # failures at t=0, 100, 200, 300: the fourth is 300 s into failing → degraded before attempt 5 succeeds.
    assert seen == [False, False, False, False, True]
    assert state.degraded is False


# --- the poller -------------------------------------------------------------------------------------------


async def synced(realigner: StateRealigner, service: ConfigService) -> None:
    await realigner.bootstrap_once()
    service.calls.clear()


async def test_poll_in_sync_only_reads_epoch(service: ConfigService, realigner: StateRealigner) -> None:
    await synced(realigner, service)
    assert await Poller(realigner, 30).tick() is PollOutcome.IN_SYNC
    assert service.calls == ["/v1/configs/epoch"]


async def test_poll_remote_epoch_ahead_resyncs(service: ConfigService, state: ConfigState, realigner) -> None:
    await synced(realigner, service)
    service.epoch = 7
    service.catalog = service.catalog.with_models([model("org/c")])
    assert await Poller(realigner, 30).tick() is PollOutcome.RESYNCED
    assert state.epoch.get() == 7 and "org/c" in state().models


async def test_poll_epoch_zero_still_catches_a_first_write(state: ConfigState, realigner, service) -> None:
    service.epoch = 1
    assert state.epoch.get() == 0
    assert await Poller(realigner, 30).tick() is PollOutcome.RESYNCED
    assert state.epoch.get() == 1


async def test_poll_bundles_hash_drift_resyncs_at_same_epoch(service: ConfigService, state: ConfigState, realigner):
    await synced(realigner, service)
    service.catalog = service.catalog.with_bundles([*service.catalog.bundles.values(), bundle("extra", 50)])
    assert await Poller(realigner, 30).tick() is PollOutcome.RESYNCED
    assert "extra" in state().bundles
    assert state.bundles_hash == service.catalog.bundles_hash


async def test_poll_bundle_config_hashes_drift_resyncs_at_same_epoch(service: ConfigService, state, realigner):
    await synced(realigner, service)
    # A baseline redeploy: same epoch, same bundles, a model moved pool.
    service.catalog = service.catalog.with_models([model("org/a", pool="gpu-a")])
    assert service.catalog.bundles_hash == state.bundles_hash
    assert await Poller(realigner, 30).tick() is PollOutcome.RESYNCED
    assert state().models["org/a"].effective_pool == "gpu-a"
    assert state.bundle_config_hashes_hash == service.catalog.bundle_config_hashes_hash


@pytest.mark.parametrize("field", ["bundles_hash", "bundle_config_hashes_hash"])
async def test_poll_skips_empty_sentinels(service: ConfigService, realigner: StateRealigner, field: str) -> None:
    await synced(realigner, service)
    service.hash_overrides = {field: ""}
    assert await Poller(realigner, 30).tick() is PollOutcome.IN_SYNC
    assert service.calls == ["/v1/configs/epoch"]


async def test_poll_rewind_exports_first_then_forces_the_epoch_with_removals(service, state, realigner) -> None:
    await synced(realigner, service)
    state.epoch.set_max(9)
    service.catalog = Catalog(service.catalog.bundles.values(), [model("org/a")])
    assert await Poller(realigner, 30).tick() is PollOutcome.RECOVERED
    assert service.calls == ["/v1/configs/epoch", "/v1/configs/export"]
    assert state.epoch.get() == 3
    assert sorted(state().models) == ["org/a"]


async def test_poll_rewind_with_failed_export_keeps_local_and_retries(service, state, realigner) -> None:
    await synced(realigner, service)
    state.epoch.set_max(9)
    service.failing = {"/v1/configs/export"}
    with pytest.raises(ConfigServiceError):
        await Poller(realigner, 30).tick()
    assert state.epoch.get() == 9
    service.failing = set()
    assert await Poller(realigner, 30).tick() is PollOutcome.RECOVERED
    assert state.epoch.get() == 3
    assert (operations(state, "poll", "failure"), operations(state, "poll", "success")) == (1.0, 1.0)
    assert (operations(state, "export", "failure"), operations(state, "export", "success")) == (1.0, 2.0)
    assert metric(state, "sie_gateway_config_applied_epoch") == 3.0


async def test_poll_failures_are_recorded_and_keep_state(service, state, realigner) -> None:
    await synced(realigner, service)
    before = (state.epoch.get(), state.bundles_hash, state.bundle_config_hashes_hash)
    service.failing = {"/v1/configs/epoch"}
    with pytest.raises(ConfigServiceError):
        await Poller(realigner, 30).tick()
    assert (state.epoch.get(), state.bundles_hash, state.bundle_config_hashes_hash) == before
    assert operations(state, "poll", "failure") == 1.0


async def test_a_failing_poll_is_said_once_and_the_poller_goes_on(
    service: ConfigService, realigner: StateRealigner, caplog: pytest.LogCaptureFixture
) -> None:
    await synced(realigner, service)
    service.failing = {"/v1/configs/epoch"}
    async with Poller(realigner, 0.01):
        await eventually(lambda: len(service.calls) >= 3, what="three failed polls")
    assert caplog.text.count("config poll failed") == 1


async def test_poller_skips_the_first_tick(service: ConfigService, realigner: StateRealigner) -> None:
    await synced(realigner, service)
    async with Poller(realigner, 30):
        for _ in range(5):
            await asyncio.sleep(0)
        assert service.calls == []  # the first tick waits one interval: the bootstrap attempt runs uncontended
    async with Poller(realigner, 0.01):
        await eventually(lambda: len(service.calls) >= 2, what="two ticks")
    assert service.calls[:2] == ["/v1/configs/epoch"] * 2


async def test_unreachable_service_is_a_config_service_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = ConfigServiceClient.create("http://config", None, transport=httpx.MockTransport(refuse))
    async with client:
        with pytest.raises(ConfigServiceError):
            await client.epoch()
