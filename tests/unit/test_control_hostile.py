"""Hostile documents against the config service's HTTP API (issue 14 §2), over the real baseline catalogue and a
real local config store: alias bombs, deep nesting, non-string and over-long ids, values JSON cannot carry and
generated documents all answer 4xx in the service's envelope and change nothing; ids that the old `/` → `__`
file naming merged are stored apart; YAML planted in the store or the catalogue is refused the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie.catalog import load_yaml
from sie.control.auth import AccessPolicy
from sie.control.http.app import build_control_app
from sie.control.loading import load_registry
from sie.control.registry import SOURCE_API
from sie.control.writes import ConfigWriter
from sie.roles.config import open_state
from sie.settings import load_settings
from sie.stores.config_store import ConfigStoreError
from sie.stores.fsspec_store import FsspecConfigStore

REPO: Final = Path(__file__).resolve().parents[2]
BUNDLES, MODELS = REPO / "config" / "bundles", REPO / "config" / "models"
ADAPTER: Final = "sie.adapters.dense:OnnxDenseAdapter"
# A small export (the baseline catalogue plus a model or two) is a few KB; a bomb would make it hundreds of MB.
SMALL_EXPORT_BYTES: Final = 64 * 1024


def model_yaml(model_id: str = "acme/model", *, tokens: int = 8192, extra: str = "") -> str:
    profiles = f"  default:\n    adapter_path: {ADAPTER}\n    max_batch_tokens: {tokens}\n"
    return f"sie_id: {model_id}\nhf_id: {model_id}\n{extra}profiles:\n{profiles}"


def billion_laughs() -> str:
    """About 1.2 KB of model YAML whose `tags` field stands for 10**9 strings once the aliases are followed."""
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, 10):
        lines.append(f"lol{level}: &lol{level} [{', '.join([f'*lol{level - 1}'] * 10)}]")
    return "\n".join(lines) + "\n" + model_yaml("acme/laughs", extra="tags: *lol9\n")


def open_app(store_dir: Path) -> tuple[httpx.AsyncClient, FsspecConfigStore]:
    registry = load_registry(BUNDLES, MODELS)
    store = FsspecConfigStore(str(store_dir))
    app = build_control_app(ConfigWriter(registry, store, epoch=store.read_epoch()), registry, AccessPolicy())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://config"), store


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, FsspecConfigStore]]:
    client, store = open_app(tmp_path / "store")
    async with client:
        yield client, store


def detail(response: httpx.Response) -> dict[str, Any]:
    return response.json()["detail"]


async def assert_unchanged(client: httpx.AsyncClient, store: FsspecConfigStore) -> None:
    """Nothing was stored, the epoch did not move, and the export is still small, valid JSON."""
    assert store.list_models() == {}
    assert (await client.get("/v1/configs/epoch")).json()["epoch"] == 0
    export = await client.get("/v1/configs/export")
    assert export.status_code == 200 and len(export.content) < SMALL_EXPORT_BYTES
    assert all(row["source"] != SOURCE_API for row in export.json()["models"])


# YAML bombs and deep nesting


async def test_billion_laughs_is_400_and_the_export_stays_small(service: tuple[httpx.AsyncClient, Any]) -> None:
    client, store = service
    body = billion_laughs()
    assert len(body) < 1300
    for response in (
        await client.post("/v1/configs/models", content=body),
        await client.put("/v1/configs/models/acme/laughs", content=body),
    ):
        assert response.status_code == 400, response.text
        assert detail(response)["error"] == "parse_error"
        assert "aliases repeat" in detail(response)["message"]
    await assert_unchanged(client, store)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("x: " + "[" * 20_000 + "]" * 20_000 + "\n", "nests deeper than 64 levels"),
        ("x: " + "{a: " * 20_000 + "1" + "}" * 20_000 + "\n", "nests deeper than 64 levels"),
        ("- " * 20_000 + "x\n", "nests deeper than 64 levels"),
        ("a: &a [*a]\n" + model_yaml(extra="x: *a\n"), "recursive alias"),
        ("".join(f"a{i}: &a{i} [*a{i - 1}]\n" if i else "a0: &a0 [x]\n" for i in range(80)) + model_yaml(), "deeper"),
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences", "recursive-alias", "alias-chain"],
)
async def test_deep_or_recursive_nesting_is_400(service: tuple[httpx.AsyncClient, Any], body: str, named: str) -> None:
    client, store = service
    response = await client.post("/v1/configs/models", content=body)
    assert response.status_code == 400, response.text
    assert detail(response)["error"] == "parse_error" and named in detail(response)["message"]
    await assert_unchanged(client, store)


async def test_modest_anchors_and_merge_keys_are_accepted(service: tuple[httpx.AsyncClient, Any]) -> None:
    client, _store = service
    body = (
        f"sie_id: acme/anchored\nhf_id: acme/anchored\nprofiles:\n"
        f"  default: &base {{adapter_path: '{ADAPTER}', max_batch_tokens: 8192}}\n"
        f"  fast: {{<<: *base, max_batch_tokens: 2048}}\n"
    )
    response = await client.post("/v1/configs/models", content=body)
    assert response.status_code == 201, response.text
    assert response.json()["created_profiles"] == ["default", "fast"]


# bad ids


@pytest.mark.parametrize("sie_id", ["5", "true", "1.5", "[acme, model]", "{a: b}", "2024-01-01T00:00:00"])
async def test_a_non_string_sie_id_is_400_invalid_model_id(service: tuple[httpx.AsyncClient, Any], sie_id: str) -> None:
    client, store = service
    body = f"sie_id: {sie_id}\nprofiles:\n  default:\n    adapter_path: {ADAPTER}\n"
    if sie_id.startswith("2024"):  # a date stays text: a well-formed string id that breaks the id rules
        body = body.replace(sie_id, "2024-01-01 00:00")
    response = await client.post("/v1/configs/models", content=body)
    assert response.status_code == 400, response.text
    assert detail(response)["error"] == "invalid_model_id"
    put = await client.put("/v1/configs/models/acme/model", content=body)
    assert put.status_code == 400 and detail(put)["error"] == "invalid_model_id"
    await assert_unchanged(client, store)


async def test_a_non_string_sie_id_names_the_problem(service: tuple[httpx.AsyncClient, Any]) -> None:
    client, _store = service
    response = await client.post("/v1/configs/models", content=model_yaml().replace("sie_id: acme/model", "sie_id: 5"))
    assert detail(response)["message"] == "Model ID must be a string, not int 5; quote it."


async def test_an_id_too_long_for_a_file_name_is_400(service: tuple[httpx.AsyncClient, Any]) -> None:
    client, store = service
    long_id = "acme/" + "m" * 300
    response = await client.post("/v1/configs/models", content=model_yaml(long_id))
    assert response.status_code == 400, response.text
    assert detail(response)["error"] == "invalid_model_id"
    assert "over the 255 bytes a file name may have" in detail(response)["message"]
    escaped = "acme/" + "_/" * 100  # short, but 3 bytes a character once escaped
    put = await client.put(f"/v1/configs/models/{escaped}", content=model_yaml(escaped))
    assert put.status_code == 400 and detail(put)["error"] == "invalid_model_id"
    await assert_unchanged(client, store)
    longest = "acme/" + "m" * (255 - len(".yaml") - len("acme__"))
    assert (await client.post("/v1/configs/models", content=model_yaml(longest))).status_code == 201


# values JSON cannot carry: refused at the door, so one bad write cannot break every later export


@pytest.mark.parametrize(
    "extra",
    [
        "tags: !!binary AAAA\n",
        "tags: !!set {a, b}\n",
        "tags: {1: one}\n",
        "tags: {? [a, b]: c}\n",
        "size: 18446744073709551616\n",
        "size: " + "9" * 5000 + "\n",
        "size: !!int abc\n",
    ],
)
async def test_values_json_cannot_carry_are_400(service: tuple[httpx.AsyncClient, Any], extra: str) -> None:
    client, store = service
    response = await client.post("/v1/configs/models", content=model_yaml(extra=extra))
    assert response.status_code == 400, response.text
    assert detail(response)["error"] == "parse_error"
    await assert_unchanged(client, store)


# generated documents: whatever arrives, the answer is a 4xx envelope or a success, and the export still works

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
MODEL_FIELDS: Final = ("sie_id", "hf_id", "profiles", "tasks", "pool", "max_sequence_length", "inputs", "package")
yaml_noise = st.text(alphabet="&*[]{}:,-!|>'\"\n #?<%@`~._/aZ09", max_size=200)


def fuzzing(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def run_generated(tmp_path: Path, bodies: st.SearchStrategy[bytes], max_examples: int) -> set[int]:
    """POST and PUT every generated body; returns the statuses seen. Any 5xx or envelope-less error fails."""
    statuses: set[int] = set()
    with asyncio.Runner() as runner:
        client, _store = open_app(tmp_path / "store")

        @fuzzing(max_examples)
        @given(body=bodies)
        def answer(body: bytes) -> None:
            for response in (
                runner.run(client.post("/v1/configs/models", content=body)),
                runner.run(client.put("/v1/configs/models/acme/fuzzed", content=body)),
            ):
                statuses.add(response.status_code)
                assert response.status_code < 500, (body, response.text)
                if response.status_code >= 400:
                    assert set(detail(response)) >= {"error", "message"}

        try:
            answer()
            export = runner.run(client.get("/v1/configs/export"))
            assert export.status_code == 200 and orjson.loads(export.content)["models"]
        finally:
            runner.run(client.aclose())
    return statuses


@st.composite
def mutated_models(draw: st.DrawFn) -> bytes:
    """A valid model with one field replaced by an arbitrary JSON value, sent as JSON text (which is YAML)."""
    document: dict[str, Any] = load_yaml(model_yaml("acme/fuzzed"))
    document[draw(st.sampled_from(MODEL_FIELDS))] = draw(json_values)
    return orjson.dumps(document)


def test_generated_model_documents_never_answer_5xx(tmp_path: Path) -> None:
    statuses = run_generated(tmp_path, mutated_models(), max_examples=150)
    assert statuses & {400, 422} and statuses - {400, 422}, statuses  # refusals and acceptances both met


def test_generated_yaml_noise_never_answers_5xx(tmp_path: Path) -> None:
    noise = yaml_noise.map(str.encode) | st.binary(max_size=100)
    assert 400 in run_generated(tmp_path, noise, max_examples=150)


# the store's file names: ids the old naming merged are kept apart


async def test_ids_that_the_old_naming_merged_coexist(tmp_path: Path) -> None:
    client, store = open_app(tmp_path / "store")
    ids = {"coll-org_/model": 1024, "coll-org/_model": 2048, "coll-org__model": 4096, "coll-org/model": 512}
    async with client:
        for model_id, tokens in ids.items():
            response = await client.post("/v1/configs/models", content=model_yaml(model_id, tokens=tokens))
            assert response.status_code == 201, response.text
        for model_id, tokens in ids.items():
            stored = load_yaml((await client.get(f"/v1/configs/models/{model_id}")).text)
            assert stored["profiles"]["default"]["max_batch_tokens"] == tokens
    assert {model_id: load_yaml(text)["sie_id"] for model_id, text in store.list_models().items()} == {
        model_id: model_id for model_id in ids
    }
    assert len(list((tmp_path / "store" / "models").iterdir())) == len(ids)
    # A restarted service (the role's own start-up) serves each with its own content.
    _store, registry, epoch = await open_state(load_settings(environ={"SIE_CONFIG_STORE_DIR": str(tmp_path / "store")}))
    assert epoch == len(ids)
    for model_id, tokens in ids.items():
        assert registry.state.find_model(model_id).raw["profiles"]["default"]["max_batch_tokens"] == tokens


# YAML read from the store and the catalogue goes through the same loader


async def test_a_bomb_planted_in_the_store_is_left_out_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    models = tmp_path / "store" / "models"
    models.mkdir(parents=True)
    (models / "acme__laughs.yaml").write_text(billion_laughs())
    (models / "acme__good.yaml").write_text(model_yaml("acme/good"))
    with caplog.at_level(logging.ERROR, logger="sie.control.loading"):
        _store, registry, _epoch = await open_state(
            load_settings(environ={"SIE_CONFIG_STORE_DIR": str(tmp_path / "store")})
        )
    assert registry.state.find_model("acme/good") is not None
    assert registry.state.find_model("acme/laughs") is None
    assert "aliases repeat" in caplog.text


def test_a_bomb_in_the_catalogue_leaves_the_model_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for path in MODELS.iterdir():
        (models / path.name).write_text(path.read_text())
    (models / "acme__laughs.yaml").write_text(billion_laughs())
    with caplog.at_level(logging.WARNING, logger="sie.control.loading"):
        registry = load_registry(BUNDLES, models)
    assert registry.available and registry.state.find_model("acme/laughs") is None
    assert registry.state.find_model("sentence-transformers/all-MiniLM-L6-v2") is not None
    assert "aliases repeat" in caplog.text


# the epoch is stored ahead of the change it numbers


class FailingStore(FsspecConfigStore):
    """A local store whose disk fills up: every write of the named kind (`epoch` or `model`) fails."""

    def __init__(self, url: str, failing: str) -> None:
        super().__init__(url)
        self.failing = failing

    def write_epoch(self, epoch: int) -> None:
        if self.failing == "epoch":
            raise ConfigStoreError("writing epoch: No space left on device")
        super().write_epoch(epoch)

    def write_model(self, model_id: str, yaml_text: str) -> None:
        if self.failing == "model":
            raise ConfigStoreError(f"writing {model_id}: No space left on device")
        super().write_model(model_id, yaml_text)


@pytest.mark.parametrize(("failing", "stored_epoch"), [("epoch", 0), ("model", 1)])
async def test_a_failed_store_write_is_never_visible_at_the_old_epoch(
    tmp_path: Path, failing: str, stored_epoch: int
) -> None:
    registry = load_registry(BUNDLES, MODELS)
    store = FailingStore(str(tmp_path / "store"), failing)
    app = build_control_app(ConfigWriter(registry, store), registry, AccessPolicy())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://config") as client:
        response = await client.post("/v1/configs/models", content=model_yaml())
        assert response.status_code == 500 and detail(response)["error"] == "internal_error"
        assert (await client.get("/v1/configs/models/acme/model")).status_code == 404
        assert (await client.get("/v1/configs/epoch")).json()["epoch"] == 0
    # A restart finds the old models under the old epoch or, when only the model write failed, under the newer
    # epoch stored ahead of it (gateways re-export); never the model under the old epoch.
    environ = {"SIE_CONFIG_STORE_DIR": str(tmp_path / "store")}
    _store, restarted, epoch = await open_state(load_settings(environ=environ))
    assert epoch == stored_epoch and restarted.state.find_model("acme/model") is None
