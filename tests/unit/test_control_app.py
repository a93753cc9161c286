"""The config service through HTTP (contracts Part A §2.4, seed 000 §3): the real baseline catalogue,
MemoryConfigStore, and a LoopbackTransport as the delta publisher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sie.catalog import load_yaml
from sie.catalog.adapters import ADAPTER_KINDS
from sie.catalog.names import CONFIG_ALL_SUBJECT, config_subject
from sie.control.auth import AccessPolicy
from sie.control.http.app import build_control_app
from sie.control.loading import load_registry
from sie.control.publisher import DeltaPublisher
from sie.control.registry import ModelRegistry
from sie.control.writes import ConfigWriter
from sie.stores.config_store import MemoryConfigStore
from sie.transport.loopback import LoopbackTransport
from sie.wire import to_json
from sie.wire.config import ConfigNotification

REPO = Path(__file__).resolve().parents[2]
BUNDLES, MODELS = REPO / "config" / "bundles", REPO / "config" / "models"
ADAPTER = "sie.adapters.dense:OnnxDenseAdapter"


def model_yaml(model_id: str = "acme/new-model", *, profiles: str | None = None, extra: str = "") -> str:
    profiles = profiles or f"  default:\n    adapter_path: {ADAPTER}\n    max_batch_tokens: 8192\n"
    return f"sie_id: {model_id}\nhf_id: {model_id}\n{extra}profiles:\n{profiles}"


FAST = "  fast:\n    extends: default\n    max_batch_tokens: 2048\n"


class Deltas:
    """Everything published on `_all` and on the default bundle's subject."""

    def __init__(self) -> None:
        self.all: list[ConfigNotification] = []
        self.bundle: list[ConfigNotification] = []


@pytest.fixture
async def transport() -> AsyncIterator[LoopbackTransport]:
    async with LoopbackTransport() as loopback:
        yield loopback


@pytest.fixture
async def deltas(transport: LoopbackTransport) -> Deltas:
    seen = Deltas()
    await transport.subscribe(CONFIG_ALL_SUBJECT, lambda _s, m: seen.all.append(m))
    await transport.subscribe(config_subject("default"), lambda _s, m: seen.bundle.append(m))
    return seen


@pytest.fixture
def store() -> MemoryConfigStore:
    return MemoryConfigStore()


@pytest.fixture
def registry() -> ModelRegistry:
    return load_registry(BUNDLES, MODELS)


@pytest.fixture
def writer(registry: ModelRegistry, store: MemoryConfigStore, transport: LoopbackTransport) -> ConfigWriter:
    return ConfigWriter(registry, store, DeltaPublisher(transport), router_id="sie-config-0")


def client_for(writer: ConfigWriter, registry: ModelRegistry, policy: AccessPolicy | None = None) -> httpx.AsyncClient:
    app = build_control_app(writer, registry, policy or AccessPolicy())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://config")


@pytest.fixture
async def client(writer: ConfigWriter, registry: ModelRegistry) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(writer, registry) as http:
        yield http


async def epoch(client: httpx.AsyncClient) -> int:
    return (await client.get("/v1/configs/epoch")).json()["epoch"]


def detail(response: httpx.Response) -> dict[str, Any]:
    return response.json()["detail"]


# the observed sequence


async def test_observed_epoch_sequence(client: httpx.AsyncClient, store: MemoryConfigStore, deltas: Deltas) -> None:
    assert await epoch(client) == 0
    created = await client.post("/v1/configs/models", content=model_yaml())
    assert created.status_code == 201
    assert created.json() == {
        "model_id": "acme/new-model",
        "created_profiles": ["default"],
        "existing_profiles_skipped": [],
        "warnings": [],
        "routable_bundles_by_profile": {"default": ["default"]},
        "router_id": "sie-config-0",
    }
    assert await epoch(client) == 1
    appended = await client.post("/v1/configs/models", content=model_yaml(profiles=FAST))
    assert appended.status_code == 201
    assert appended.json()["created_profiles"] == ["fast"]
    assert await epoch(client) == 2
    replacement = model_yaml(extra="max_sequence_length: 128\n")
    replaced = await client.put("/v1/configs/models/acme/new-model", content=replacement)
    assert replaced.status_code == 200
    assert replaced.json() == {
        "model_id": "acme/new-model", "replaced": True, "unchanged": False,
        "affected_bundles": ["default"], "warnings": [], "router_id": "sie-config-0",
    }  # fmt: skip
    assert await epoch(client) == 3
    same = await client.put("/v1/configs/models/acme/new-model", content=replacement)
    assert same.json()["unchanged"] is True and same.json()["affected_bundles"] == []
    assert await epoch(client) == 3
    deleted = await client.delete("/v1/configs/models/acme/new-model")
    assert deleted.json() == {
        "model_id": "acme/new-model", "deleted": True, "unchanged": False, "fallback": None,
        "affected_bundles": ["default"], "epoch": 4, "distribution": "epoch_export",
    }  # fmt: skip
    assert await epoch(client) == 4 and store.read_epoch() == 4
    assert (await client.get("/v1/configs/models/acme/new-model")).status_code == 404
    assert len(deltas.all) == 3  # two POSTs and one PUT; the delete travels by epoch + export


async def test_delta_fields_and_byte_identical_copies(client: httpx.AsyncClient, deltas: Deltas) -> None:
    await client.post("/v1/configs/models", content=model_yaml())
    await client.post("/v1/configs/models", content=model_yaml(profiles=FAST))
    assert len(deltas.all) == len(deltas.bundle) == 2  # one per write, one affected bundle
    for on_all, on_bundle in zip(deltas.all, deltas.bundle, strict=True):
        assert to_json(on_all) == to_json(on_bundle)
    second = deltas.all[1]
    assert (second.router_id, second.bundle_id, second.epoch, second.model_id) == (
        "sie-config-0", "default", 2, "acme/new-model",
    )  # fmt: skip
    assert second.profiles_added == ["fast"] and second.affected_bundles == ["default"]
    assert second.pool == "default"
    merged = load_yaml(second.model_config)
    assert set(merged["profiles"]) == {"default", "fast"}  # the merged YAML, not the partial body
    export = (await client.get("/v1/configs/export")).json()
    assert second.bundle_config_hash == export["bundle_config_hashes"]["default"]
    assert second.bundle_pool_config_hashes == {"default": export["bundle_pool_config_hashes"]["default"]}
    assert second.bundle_adapters == export["bundle_adapters"]["default"]


async def test_replay_without_key_is_200_and_skips_everything(client: httpx.AsyncClient, deltas: Deltas) -> None:
    await client.post("/v1/configs/models", content=model_yaml())
    again = await client.post("/v1/configs/models", content=model_yaml())
    assert again.status_code == 200
    assert again.json()["created_profiles"] == [] and again.json()["existing_profiles_skipped"] == ["default"]
    assert await epoch(client) == 1 and len(deltas.all) == 1


async def test_persists_merged_yaml(client: httpx.AsyncClient, store: MemoryConfigStore) -> None:
    await client.post("/v1/configs/models", content=model_yaml())
    await client.post("/v1/configs/models", content=model_yaml(profiles=FAST, extra="max_sequence_length: 64\n"))
    stored = load_yaml(store.list_models()["acme/new-model"])
    assert set(stored["profiles"]) == {"default", "fast"} and stored["max_sequence_length"] == 64
    text = (await client.get("/v1/configs/models/acme/new-model")).text
    assert load_yaml(text) == stored


# errors


@pytest.mark.parametrize(
    ("body", "status", "code", "message"),
    [
        ("a: [", 400, "parse_error", "Invalid YAML"),
        ("- a\n- b\n", 400, "parse_error", "Expected YAML mapping at top level"),
        (model_yaml("foo/status"), 400, "invalid_model_id", "must not end with '/status'"),
        (model_yaml("status"), 400, "invalid_model_id", "must not end with '/status'"),
        (model_yaml("a/../b"), 400, "invalid_model_id", "Model ID contains invalid characters."),
        (model_yaml(".."), 400, "invalid_model_id", "Model ID contains invalid characters."),
        ("sie_id: acme/x\nhf_id: acme/x\n", 422, "validation_error", "Missing required field: profiles"),
    ],
)
async def test_rejected_before_any_state_change(
    client: httpx.AsyncClient, body: str, status: int, code: str, message: str
) -> None:
    response = await client.post("/v1/configs/models", content=body)
    assert response.status_code == status
    assert detail(response)["error"] == code and message in detail(response)["message"]
    assert await epoch(client) == 0


async def test_validation_error_details(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/configs/models", content="sie_id: acme/x\nhf_id: acme/x\n")
    assert detail(response)["details"] == [{"message": "Missing required field: profiles"}]


async def test_unknown_adapter_is_422(client: httpx.AsyncClient) -> None:
    profiles = "  default:\n    adapter_path: some_other_pkg.adapters.foo:Foo\n    max_batch_tokens: 8192\n"
    response = await client.post("/v1/configs/models", content=model_yaml(profiles=profiles))
    assert response.status_code == 422
    assert detail(response)["message"] == "Adapter(s) not in any known bundle: some_other_pkg.adapters.foo"
    assert detail(response)["details"] == [{"message": detail(response)["message"]}]
    assert await epoch(client) == 0


async def test_changed_profile_is_409(client: httpx.AsyncClient) -> None:
    await client.post("/v1/configs/models", content=model_yaml())
    changed = f"  default:\n    adapter_path: {ADAPTER}\n    max_batch_tokens: 4096\n"
    response = await client.post("/v1/configs/models", content=model_yaml(profiles=changed))
    assert response.status_code == 409
    assert detail(response)["error"] == "content_conflict"
    assert detail(response)["conflicting_profiles"] == ["default"]
    assert await epoch(client) == 1


async def test_changed_metadata_is_409(client: httpx.AsyncClient) -> None:
    await client.post("/v1/configs/models", content=model_yaml(extra="max_sequence_length: 128\n"))
    body = model_yaml(profiles=FAST, extra="max_sequence_length: 256\n")
    response = await client.post("/v1/configs/models", content=body)
    assert response.status_code == 409 and detail(response)["conflicting_fields"] == ["max_sequence_length"]
    assert await epoch(client) == 1


async def test_body_over_256_kib_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/configs/models", content=b"#" * (256 * 1024 + 1))
    assert response.status_code == 413 and detail(response)["error"] == "payload_too_large"


async def test_get_reserved_id_is_400_and_unknown_is_404(client: httpx.AsyncClient) -> None:
    reserved = await client.get("/v1/configs/models/foo/status")
    assert reserved.status_code == 400 and detail(reserved)["error"] == "invalid_model_id"
    unknown = await client.get("/v1/configs/models/acme/missing")
    assert unknown.status_code == 404
    assert detail(unknown) == {
        "error": "model_not_found",
        "message": "Model 'acme/missing' does not exist in the catalog.",
        "model_id": "acme/missing",
    }


async def test_delete_without_store_is_409(registry: ModelRegistry) -> None:
    async with client_for(ConfigWriter(registry), registry) as http:
        response = await http.delete("/v1/configs/models/acme/new-model")
        assert response.status_code == 409 and detail(response)["error"] == "config_store_required"
        created = await http.post("/v1/configs/models", content=model_yaml())
        assert created.json()["router_id"] == "standalone"
        assert await epoch(http) == 0  # no store: the epoch does not move


async def test_delete_filesystem_model_is_unchanged(client: httpx.AsyncClient) -> None:
    response = await client.delete("/v1/configs/models/rasyosef/splade-tiny")
    assert response.status_code == 200
    assert response.json()["deleted"] is False and response.json()["unchanged"] is True
    assert await epoch(client) == 0


async def test_delete_api_copy_falls_back_to_filesystem(client: httpx.AsyncClient) -> None:
    body = (REPO / "config/models/rasyosef__splade-tiny.yaml").read_text()
    extra = "  short:\n    extends: default\n    max_batch_tokens: 512\n"
    appended = body + extra
    assert (await client.post("/v1/configs/models", content=appended)).status_code == 201
    deleted = (await client.delete("/v1/configs/models/rasyosef/splade-tiny")).json()
    assert deleted["deleted"] is True and deleted["fallback"] == "filesystem"
    listed = {row["model_id"]: row for row in (await client.get("/v1/configs/models")).json()["models"]}
    assert listed["rasyosef/splade-tiny"]["source"] == "filesystem"
    assert "rasyosef/splade-tiny:short" not in listed


# NATS


class FailingBus:
    """A bus whose publishes to some subjects fail; flush follows `connected`."""

    def __init__(self, fail_subjects: set[str] = frozenset(), connected: bool = True) -> None:
        self.fail_subjects = fail_subjects
        self.connected = connected
        self.published: list[str] = []

    async def flush(self) -> None:
        from sie.transport.base import TransportUnavailable

        if not self.connected:
            raise TransportUnavailable("not connected")

    async def publish(self, subject: str, message: Any) -> None:
        from sie.transport.base import TransportUnavailable

        if subject in self.fail_subjects:
            raise TransportUnavailable(f"publish to {subject} failed")
        self.published.append(subject)


async def test_disconnected_publisher_is_503_with_no_state_change(registry: ModelRegistry) -> None:
    store = MemoryConfigStore()
    transport = LoopbackTransport()
    async with transport:
        pass  # entered and closed: every call now raises TransportUnavailable
    writer = ConfigWriter(registry, store, DeltaPublisher(transport), router_id="sie-config")
    async with client_for(writer, registry) as http:
        response = await http.post("/v1/configs/models", content=model_yaml())
        assert response.status_code == 503 and detail(response)["error"] == "nats_unavailable"
        assert await epoch(http) == 0 and store.list_models() == {}
        assert (await http.get("/v1/configs/models/acme/new-model")).status_code == 404


async def test_partial_publish_is_success_with_warning(registry: ModelRegistry) -> None:
    bus = FailingBus({config_subject("default")})
    writer = ConfigWriter(registry, MemoryConfigStore(), DeltaPublisher(bus), router_id="sie-config")
    async with client_for(writer, registry) as http:
        response = await http.post("/v1/configs/models", content=model_yaml())
        assert response.status_code == 201
        [warning] = response.json()["warnings"]
        assert warning["code"] == "nats_publish_partial" and warning["failed_bundles"] == ["default"]
        assert await epoch(http) == 1


# concurrency


async def test_twenty_distinct_writers_advance_the_epoch_twenty_times(
    client: httpx.AsyncClient, deltas: Deltas
) -> None:
    bodies = [model_yaml(f"acme/model-{index}") for index in range(20)]
    responses = await asyncio.gather(*(client.post("/v1/configs/models", content=body) for body in bodies))
    assert [response.status_code for response in responses] == [201] * 20
    assert await epoch(client) == 20
    assert sorted(delta.epoch for delta in deltas.all) == list(range(1, 21))


async def test_twenty_identical_writers_advance_the_epoch_once(client: httpx.AsyncClient, deltas: Deltas) -> None:
    responses = await asyncio.gather(*(client.post("/v1/configs/models", content=model_yaml()) for _ in range(20)))
    assert sorted(response.status_code for response in responses) == [200] * 19 + [201]
    assert await epoch(client) == 1 and len(deltas.all) == 1


# idempotency


async def test_idempotent_replay_is_verbatim_and_not_reexecuted(client: httpx.AsyncClient, deltas: Deltas) -> None:
    headers = {"Idempotency-Key": "k1"}
    first = await client.post("/v1/configs/models", content=model_yaml(), headers=headers)
    second = await client.post("/v1/configs/models", content=model_yaml(), headers=headers)
    assert first.status_code == second.status_code == 201
    assert first.content == second.content
    assert await epoch(client) == 1 and len(deltas.all) == 1


async def test_idempotency_key_with_other_payload_is_422(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "k1"}
    await client.post("/v1/configs/models", content=model_yaml(), headers=headers)
    response = await client.post("/v1/configs/models", content=model_yaml("acme/other"), headers=headers)
    assert response.status_code == 422
    assert detail(response) == {
        "error": "idempotency_mismatch",
        "message": "Idempotency-Key reused with different payload.",
    }
    put = await client.put("/v1/configs/models/acme/new-model", content=model_yaml(), headers=headers)
    assert put.status_code == 422  # PUT fingerprints the method and id too


async def test_concurrent_duplicates_execute_once(client: httpx.AsyncClient, deltas: Deltas) -> None:
    headers = {"Idempotency-Key": "same"}
    responses = await asyncio.gather(
        *(client.post("/v1/configs/models", content=model_yaml(), headers=headers) for _ in range(10))
    )
    assert {response.status_code for response in responses} == {201}
    assert len({response.content for response in responses}) == 1
    assert await epoch(client) == 1 and len(deltas.all) == 1


# reads


async def test_list_models_includes_variants_and_sources(client: httpx.AsyncClient) -> None:
    rows = {row["model_id"]: row for row in (await client.get("/v1/configs/models")).json()["models"]}
    minilm = rows["sentence-transformers/all-MiniLM-L6-v2"]
    assert minilm == {
        "model_id": "sentence-transformers/all-MiniLM-L6-v2",
        "profiles": ["default", "int8", "multivector"],
        "source": "filesystem",
    }
    assert rows["sentence-transformers/all-MiniLM-L6-v2:int8"]["profiles"] == ["int8"]


async def test_variant_yaml_is_minimal(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/configs/models/sentence-transformers/all-MiniLM-L6-v2:int8")
    assert response.headers["content-type"].startswith("application/x-yaml")
    assert load_yaml(response.text) == {
        "sie_id": "sentence-transformers/all-MiniLM-L6-v2:int8",
        "source": "filesystem",
        "bundles": ["default"],
    }


async def test_bundles(client: httpx.AsyncClient) -> None:
    listed = (await client.get("/v1/configs/bundles")).json()["bundles"]
    assert listed == [
        {
            "bundle_id": "default",
            "engine": "onnxruntime",
            "priority": 10,
            "adapter_count": len(ADAPTER_KINDS),
            "source": "filesystem",
        }
    ]
    one = await client.get("/v1/configs/bundles/default")
    assert one.headers["content-type"].startswith("application/x-yaml")
    assert load_yaml(one.text)["name"] == "default"
    missing = await client.get("/v1/configs/bundles/nope")
    assert missing.status_code == 404 and detail(missing)["bundle_id"] == "nope"


async def test_resolve(client: httpx.AsyncClient) -> None:
    body = {"model": "sentence-transformers/all-MiniLM-L6-v2:int8"}
    resolved = (await client.post("/v1/configs/resolve", json=body)).json()
    assert resolved == {
        "model": "sentence-transformers/all-MiniLM-L6-v2:int8",
        "resolved_bundle": "default",
        "compatible_bundles": ["default"],
        "profiles": ["int8"],
    }
    conflict = await client.post("/v1/configs/resolve", json={"model": "candle:/rasyosef/splade-tiny"})
    assert conflict.status_code == 409 and detail(conflict)["error"] == "bundle_conflict"
    missing = await client.post("/v1/configs/resolve", json={"model": "acme/none"})
    assert missing.status_code == 404 and detail(missing)["model"] == "acme/none"
    assert detail(await client.post("/v1/configs/resolve", content=b"{"))["error"] == "parse_error"
    assert detail(await client.post("/v1/configs/resolve", json={}))["error"] == "missing_field"


async def test_epoch_fingerprints_match_export(client: httpx.AsyncClient, registry: ModelRegistry) -> None:
    view = (await client.get("/v1/configs/epoch")).json()
    catalog = registry.state.catalog
    assert view == {
        "epoch": 0,
        "bundles_hash": catalog.bundles_hash,
        "bundle_config_hashes_hash": catalog.bundle_config_hashes_hash,
    }


async def test_export_shape(client: httpx.AsyncClient) -> None:
    await client.post("/v1/configs/models", content=model_yaml(extra="pool: Batch\n"))
    export = (await client.get("/v1/configs/export")).json()
    assert set(export) == {
        "snapshot_version", "epoch", "generated_at", "bundle_config_hashes",
        "bundle_pool_config_hashes", "bundle_adapters", "models",
    }  # fmt: skip
    assert export["snapshot_version"] == 1 and export["epoch"] == 1
    assert export["generated_at"].endswith("+00:00")
    rows = {row["model_id"]: row for row in export["models"]}
    assert len(rows) == 6
    new = rows["acme/new-model"]
    assert set(new) == {"model_id", "model_config", "raw_yaml", "affected_bundles", "pool", "source"}
    assert (new["pool"], new["source"], new["affected_bundles"]) == ("batch", "api", ["default"])
    assert load_yaml(new["raw_yaml"]) == new["model_config"]
    assert set(export["bundle_pool_config_hashes"]["default"]) == {"default", "batch"}


async def test_health_and_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}


async def test_broken_bundles_dir_is_unavailable_but_epoch_answers(tmp_path: Path) -> None:
    (tmp_path / "bundles").mkdir()
    (tmp_path / "bundles" / "bad.yaml").write_text("name: [\n")
    registry = load_registry(tmp_path / "bundles", MODELS)
    async with client_for(ConfigWriter(registry, MemoryConfigStore()), registry) as http:
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and detail(ready)["error"] == "registry_unavailable"
        for path in ("/v1/configs/models", "/v1/configs/bundles", "/v1/configs/export"):
            response = await http.get(path)
            assert response.status_code == 503 and detail(response)["error"] == "registry_unavailable"
        posted = await http.post("/v1/configs/models", content=model_yaml())
        assert detail(posted)["error"] == "registry_unavailable"
        assert (await http.get("/v1/configs/epoch")).json() == {
            "epoch": 0, "bundles_hash": "", "bundle_config_hashes_hash": "",
        }  # fmt: skip


async def test_unknown_route_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/configs/nothing")).status_code == 404
    assert (await client.patch("/v1/configs/models")).status_code == 405


async def test_owner_cancelled_before_commit_gives_duplicate_503(
    client: httpx.AsyncClient, writer: ConfigWriter
) -> None:
    headers = {"Idempotency-Key": "k-cancel"}
    async with writer._lock:  # noqa: SLF001 - hold the write lock so the owner waits before committing
        owner = asyncio.create_task(client.post("/v1/configs/models", content=model_yaml(), headers=headers))
        await asyncio.sleep(0.01)
        duplicate = asyncio.create_task(client.post("/v1/configs/models", content=model_yaml(), headers=headers))
        await asyncio.sleep(0.01)
        owner.cancel()
        response = await duplicate
    assert response.status_code == 503 and detail(response)["error"] == "idempotent_inflight_cancelled"
    assert await epoch(client) == 0
    retried = await client.post("/v1/configs/models", content=model_yaml(), headers=headers)
    assert retried.status_code == 201 and await epoch(client) == 1


async def test_a_replay_is_checked_against_a_drifted_store(client: httpx.AsyncClient, store: MemoryConfigStore) -> None:
    assert (await client.post("/v1/configs/models", content=model_yaml("acme/drift"))).status_code == 201
    drifted = model_yaml("acme/drift").replace("max_batch_tokens: 8192", "max_batch_tokens: 1024")
    store.write_model("acme/drift", drifted)  # someone edited the stored file behind the registry's back
    replay = await client.post("/v1/configs/models", content=model_yaml("acme/drift"))
    assert replay.status_code == 409
    assert replay.json()["detail"]["error"] == "content_conflict"
