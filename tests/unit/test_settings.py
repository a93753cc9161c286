"""Unit tests for sie.settings: seed defaults, parsing, precedence, error collection and the docs table."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
from pathlib import Path

import attrs
import pytest

from sie.settings import (
    Settings,
    SettingsError,
    StreamSettings,
    describe_groups,
    describe_settings,
    flag_paths,
    format_settings_error,
    huge_pages_environment,
    ignored_variables,
    ignored_variables_note,
    load_role_settings,
    load_settings,
    parse_flags,
    render_settings_markdown,
    setting_paths,
    unrecognised_variables,
    wants_huge_pages,
)
from sie.settings._spec import ROLES

REPO = Path(__file__).resolve().parents[2]


def test_defaults_match_the_seeds() -> None:
    s = load_settings({})
    # seed 000 §8.2, §2, §4.2-4.3, §13; seed 001 "Readiness"; contracts A §2.1, B §4.3
    assert s.stream.storage == "memory"
    assert s.stream.replicas == 1
    assert s.stream.max_age_s == 1800.0
    assert s.stream.max_msgs == 100_000
    assert s.stream.max_deliver == 20
    # Not contracts B §4.3's 30 s: sidecars progress-ACK what they hold, so a dead one's work waits 5 s (issue 13 §4).
    assert s.stream.ack_wait_s == 5.0
    assert s.stream.nak_delay_s == 5.0
    assert s.gateway.request_timeout_s == 30.0
    assert s.gateway.max_stream_pending == 50_000
    assert s.config_sync.poll_interval_s == 30.0
    assert s.config_sync.trusted_producers == ("sie-config",)
    assert s.config_sync.trust_any_producer is False
    assert s.config_sync.service_url is None
    assert s.sidecar.probe_port == 9095
    assert (s.lane.pool, s.lane.machine_profile, s.lane.bundle) == ("default", "default", "default")
    assert s.auth.mode == "none"
    assert s.nats.url is None
    assert s.process.worker_id == "worker-unknown"
    # contracts B §5.1, §8.3
    assert s.batching.max_batch_items == 64
    assert s.batching.max_batch_wait_s == pytest.approx(0.010, abs=1e-12)
    assert s.batching.max_pending_items == 512


def test_direct_construction_equals_loading_an_empty_environment() -> None:
    loaded = load_settings({"POD_NAME": "p"})
    built = Settings()
    assert attrs.evolve(built, process=loaded.process, catalog=loaded.catalog, worker=loaded.worker) == loaded


def test_catalogue_defaults_point_at_the_package_data() -> None:
    s = load_settings({})
    assert s.catalog.bundles_dir == REPO / "src" / "sie" / "config" / "bundles"
    assert s.catalog.models_dir == REPO / "src" / "sie" / "config" / "models"
    # The repository's top-level config/ is the same directory, for the tests and docs that name it.
    assert (REPO / "config" / "models").resolve() == s.catalog.models_dir.resolve()


def test_environment_values_are_parsed() -> None:
    s = load_settings(
        {
            "SIE_NATS_URL": "nats://127.0.0.1:4222",
            "SIE_STREAM_STORAGE": "FILE",
            "SIE_STREAM_REPLICAS": "3",
            "SIE_STREAM_MAX_AGE_S": "90.5",
            "SIE_GATEWAY_PORT": "9000",
            "SIE_POOL": " GPU-Pool ",
            "SIE_AUTH_MODE": "static",
            "SIE_LOG_LEVEL": "WARN",
            "SIE_MAX_BATCH_WAIT_MS": "25",
            "SIE_WORKER_MEMORY_BUDGET_BYTES": "2GiB",
            "SIE_GATEWAY_MAX_BODY_BYTES": "1000",
            "SIE_CONFIG_SERVICE_URL": "http://config:8081/",
            "SIE_IPC_SOCKET_PATH": "/run/sie/ipc.sock",
        }
    )
    assert s.nats.url == "nats://127.0.0.1:4222"
    assert s.stream.storage == "file"
    assert s.stream.replicas == 3
    assert s.stream.max_age_s == pytest.approx(90.5, abs=1e-12)
    assert s.gateway.port == 9000
    assert s.lane.pool == "gpu-pool"
    assert s.auth.mode == "token"
    assert s.telemetry.log_level == "warning"
    assert s.batching.max_batch_wait_s == pytest.approx(0.025, abs=1e-12)
    assert s.worker.memory_budget_bytes == 2 * 2**30
    assert s.gateway.max_body_bytes == 1000
    assert s.config_sync.service_url == "http://config:8081"
    assert s.worker.socket_path == Path("/run/sie/ipc.sock")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("Yes", True)]
    + [("false", False), ("False", False), ("0", False), ("no", False), ("NO", False)],
)
def test_booleans(raw: str, expected: bool) -> None:
    s = load_settings({"SIE_NATS_CONFIG_TRUST_ANY_PRODUCER": raw})
    assert s.config_sync.trust_any_producer is expected


def test_lists_are_comma_separated_and_trimmed() -> None:
    s = load_settings(
        {
            "SIE_NATS_CONFIG_TRUSTED_PRODUCERS": " sie-config , sie-sie-cluster-config,, ",
            "SIE_PRELOAD_MODELS": "BAAI/bge-m3,  sentence-transformers/all-MiniLM-L6-v2",
            "SIE_GATEWAY_CONFIGURED_GPUS": "L4, a100-80gb",
            "SIE_COMPAT_DEFAULT_MODELS": " Rerank = cross-encoder/ms-marco-MiniLM-L6-v2 ,, embed=BAAI/bge-m3:sparse",
        }
    )
    assert s.config_sync.trusted_producers == ("sie-config", "sie-sie-cluster-config")
    assert s.worker.preload_models == ("BAAI/bge-m3", "sentence-transformers/all-MiniLM-L6-v2")
    assert s.gateway.configured_gpus == ("l4", "a100-80gb")
    assert s.gateway.compat_default_models == (
        ("rerank", "cross-encoder/ms-marco-MiniLM-L6-v2"),
        ("embed", "BAAI/bge-m3:sparse"),
    )


def test_blank_values_count_as_unset() -> None:
    s = load_settings({"SIE_NATS_URL": "  ", "SIE_STREAM_REPLICAS": "", "SIE_NATS_CONFIG_TRUSTED_PRODUCERS": ""})
    assert s.nats.url is None
    assert s.stream.replicas == 1
    assert s.config_sync.trusted_producers == ("sie-config",)


def test_aliases_are_read_when_the_primary_name_is_unset() -> None:
    s = load_settings({"SIE_AUTH_TOKEN": "t1", "HOSTNAME": "pod-7", "SIE_LOCAL_CACHE": "/cache"})
    assert s.auth.tokens == ("t1",)
    assert s.process.worker_id == "pod-7"
    assert s.worker.model_cache == Path("/cache")
    both = load_settings({"SIE_AUTH_TOKENS": "a,b", "SIE_AUTH_TOKEN": "t1", "SIE_WORKER_ID": "w", "HOSTNAME": "h"})
    assert both.auth.tokens == ("a", "b")
    assert both.process.worker_id == "w"


def test_router_id_is_host_and_pid_unless_set() -> None:
    pod = load_settings({"POD_NAME": "sie-config-abc", "HOSTNAME": "ignored"})
    assert re.fullmatch(r"sie-config-abc-\d+", pod.process.router_id)
    assert re.fullmatch(r"host-1-\d+", load_settings({"HOSTNAME": "host-1"}).process.router_id)
    assert load_settings({"SIE_ROUTER_ID": "gw-1", "POD_NAME": "x"}).process.router_id == "gw-1"


def test_model_cache_follows_xdg_cache_home() -> None:
    s = load_settings({"XDG_CACHE_HOME": "/var/cache"})
    assert s.worker.model_cache == Path("/var/cache/sie/models")


def test_overrides_win_over_the_environment() -> None:
    env = {"SIE_GATEWAY_PORT": "9000", "SIE_STREAM_REPLICAS": "2", "SIE_LOG_FORMAT": "text"}
    s = load_settings(
        env,
        {
            "gateway.port": 9100,
            "stream.replicas": None,  # a flag the user did not give
            "telemetry.log_format": "JSON",
            "worker.preload_models": ["a", " b "],
            "batching.max_batch_wait_s": 5,  # the flag mirrors SIE_MAX_BATCH_WAIT_MS, so milliseconds
        },
    )
    assert s.gateway.port == 9100
    assert s.stream.replicas == 2
    assert s.telemetry.log_format == "json"
    assert s.worker.preload_models == ("a", "b")
    assert s.batching.max_batch_wait_s == pytest.approx(0.005, abs=1e-12)


def test_log_format_reads_the_deprecated_log_json_as_an_alias() -> None:
    assert load_settings({}).telemetry.log_format == "text"
    assert load_settings({"SIE_LOG_JSON": "true"}).telemetry.log_format == "json"
    assert load_settings({"SIE_LOG_JSON": "0"}).telemetry.log_format == "text"
    assert load_settings({"SIE_LOG_FORMAT": "text", "SIE_LOG_JSON": "true"}).telemetry.log_format == "text"
    with pytest.raises(SettingsError, match="SIE_LOG_JSON='maybe' is not allowed; expected one of: text, json"):
        load_settings({"SIE_LOG_JSON": "maybe"})


def test_bad_override_names_the_flag() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({}, {"gateway.port": "eighty", "auth.admin_token": "", "nope.field": 1})
    assert caught.value.problems == (
        "unknown setting 'nope.field'; expected a field path such as 'gateway.port'",
        "--port='eighty' is not an integer; expected a whole number between 0 and 65535",
    )


def test_every_bad_variable_is_reported_together() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(
            {
                "SIE_STREAM_REPLICAS": "three",
                "SIE_STREAM_STORAGE": "disk",
                "SIE_AUTH_MODE": "tokn",
                "SIE_GATEWAY_REQUEST_TIMEOUT": "-1",
                "SIE_LOG_FORMAT": "maybe",
                "SIE_POOL": "bad.pool",
                "SIE_WORKER_BACKEND": "random",
            }
        )
    problems = caught.value.problems
    assert "SIE_STREAM_REPLICAS='three' is not an integer; expected a whole number >= 1" in problems
    assert "SIE_STREAM_STORAGE='disk' is not allowed; expected one of: memory, file" in problems
    assert "SIE_AUTH_MODE='tokn' is not allowed; expected one of: none, token, static" in problems
    assert "SIE_GATEWAY_REQUEST_TIMEOUT='-1' is out of range; expected seconds > 0" in problems
    assert "SIE_LOG_FORMAT='maybe' is not allowed; expected one of: text, json" in problems
    assert any(p.startswith("SIE_POOL='bad.pool' is not a valid name") for p in problems)
    assert any(p.startswith("SIE_WORKER_BACKEND='random' is not allowed") for p in problems)
    assert len(problems) == 7
    message = format_settings_error(caught.value)
    for name in ("SIE_STREAM_REPLICAS", "SIE_STREAM_STORAGE", "SIE_AUTH_MODE", "SIE_WORKER_BACKEND"):
        assert name in message
    assert "Traceback" not in message


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("SIE_GATEWAY_PORT", "70000", "is out of range; expected a whole number between 0 and 65535"),
        ("SIE_STREAM_MAX_AGE_S", "nan", "is not a finite number; expected seconds > 0"),
        ("SIE_STREAM_MAX_AGE_S", "30s", "is not a number; expected seconds > 0"),
        ("SIE_MAX_DELIVER", "0", "is out of range; expected a whole number >= 1"),
        ("SIE_WORKER_MEMORY_BUDGET_BYTES", "lots", "is not a size"),
        ("SIE_CONFIG_SERVICE_URL", "localhost:8081", "is not an http(s) URL"),
        ("SIE_GATEWAY_CONFIGURED_GPUS", "ok,no!", "has an item 'no!' that is not a valid name"),
        ("SIE_MAX_BATCH_WAIT_MS", "-1", "is out of range; expected milliseconds >= 0"),
        ("SIE_COMPAT_DEFAULT_MODELS", "rerank", "has an entry 'rerank' that is not key=value"),
        ("SIE_COMPAT_DEFAULT_MODELS", "score=m", "has an entry 'score=m' whose key is not one of: embed,"),
        ("SIE_COMPAT_DEFAULT_MODELS", "embed=a,embed=b", "names 'embed' twice"),
    ],
)
def test_invalid_values_name_variable_value_and_what_is_allowed(name: str, raw: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({name: raw})
    (problem,) = caught.value.problems
    assert problem.startswith(f"{name}={raw!r} ")
    assert fragment in problem


def test_secrets_are_masked_in_errors_and_repr() -> None:
    s = load_settings({"SIE_ADMIN_TOKEN": "hunter2", "SIE_AUTH_TOKENS": "tok-a", "SIE_NATS_PASSWORD": "pw"})
    assert s.auth.admin_token == "hunter2"
    for secret in ("hunter2", "tok-a", "pw'"):
        assert secret not in repr(s)


def test_settings_are_frozen() -> None:
    s = load_settings({})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.gateway.port = 1  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        s.stream = StreamSettings()  # type: ignore[misc]
    assert hash(s) == hash(load_settings({}))  # every value is immutable, so settings can key caches


def test_unrecognised_variables_flags_likely_typos() -> None:
    env = {"SIE_STREAM_REPLICA": "3", "SIE_AUTH_TOKEN": "x", "SIE_POOL": "a", "PATH": "/bin"}
    assert unrecognised_variables(env) == ["SIE_STREAM_REPLICA"]


def test_every_field_is_documented_once() -> None:
    docs = describe_settings()
    assert [doc.path for doc in docs] == setting_paths()
    names = [name for doc in docs for name in (doc.env, *doc.aliases)]
    assert len(names) == len(set(names)), "an environment variable is declared twice"
    for role in ROLES:
        flags = [doc.flag for doc in docs if doc.flag and role in doc.roles]
        assert len(flags) == len(set(flags)), f"two settings of role {role} share a CLI flag"
    assert all(doc.doc.endswith(".") and doc.type for doc in docs)
    assert [group.name for group in describe_groups()] == [field.name for field in attrs.fields(Settings)]


def test_docs_table_is_current_and_lists_each_variable_once() -> None:
    committed = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    assert committed == render_settings_markdown(), "run: python scripts/gen_settings_doc.py --write"
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \|", committed, flags=re.MULTILINE)
    assert len(rows) == len(describe_settings())
    assert len(rows) == len(set(rows))


def test_only_the_settings_package_reads_the_environment() -> None:
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "src" / "sie").rglob("*.py")
        if "settings" not in path.relative_to(REPO / "src" / "sie").parts[:1]
        and re.search(r"os\.environ|getenv\(", path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def _attributes_read(module_name: str) -> set[str]:
    """Every attribute name the module's code reads (`x.field`), from its syntax tree."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_every_setting_is_read_by_the_modules_it_names() -> None:
    """No declared setting is inert: each names the modules that read it, and each of them does."""
    inert = []
    for doc in describe_settings():
        field = doc.path.split(".")[1]
        assert doc.roles, f"{doc.env} names no role"
        for module_name in doc.read_by:
            assert not module_name.startswith("sie.settings"), f"{doc.env}: the settings package reads nothing"
            if field not in _attributes_read(module_name):
                inert.append(f"{doc.env}: {module_name} never reads `.{field}`")
    assert inert == []


def test_a_role_refuses_flags_it_does_not_read_and_variables_that_are_no_setting() -> None:
    with pytest.raises(SettingsError) as caught:
        load_role_settings(
            ["--role", "gateway", "--max-batch-requests", "3", "--bogus", "1"],
            {"SIE_MODEL_CACHE": "/models", "SIE_STREAM_REPLICA": "3", "HOSTNAME": "pod-1"},
        )
    assert caught.value.problems == (
        "option --max-batch-requests does not apply to role 'gateway'; it is read by role sidecar, worker, all",
        "unknown option '--bogus'; docs/settings.md lists every option and the roles that read it",
        "SIE_STREAM_REPLICA is not a setting of this version (a typo, or a feature not built yet); unset it; "
        "did you mean SIE_STREAM_REPLICAS?",
    )


def test_a_role_ignores_the_variables_of_other_roles_and_names_them_once() -> None:
    """A shared environment (a Compose env_file, a shell with every role's variables) starts each role."""
    shared = {"SIE_MODEL_CACHE": "/models", "SIE_CONFIG_STORE_DIR": "/store", "SIE_NATS_URL": "nats://n:4222"}
    settings = load_role_settings(["--role", "gateway"], shared)
    assert settings.nats.url == "nats://n:4222"
    assert settings == load_role_settings(["--role", "gateway"], {"SIE_NATS_URL": "nats://n:4222"})  # not read at all
    assert ignored_variables("gateway", shared) == [
        "SIE_CONFIG_STORE_DIR (read by role config, all)",
        "SIE_MODEL_CACHE (read by role worker, all)",
    ]
    assert ignored_variables_note("gateway", shared) == (
        "role 'gateway' ignores settings of other roles set in its environment: "
        "SIE_CONFIG_STORE_DIR (read by role config, all); SIE_MODEL_CACHE (read by role worker, all)"
    )
    assert ignored_variables_note("all", {"SIE_MODEL_CACHE": "/models"}) is None


def test_a_typo_with_no_close_setting_gets_no_suggestion() -> None:
    with pytest.raises(SettingsError) as caught:
        load_role_settings(["--role", "gateway"], {"SIE_XYZZY_QUUX_FROB": "1"})
    assert caught.value.problems == (
        "SIE_XYZZY_QUUX_FROB is not a setting of this version (a typo, or a feature not built yet); unset it",
    )


@pytest.mark.parametrize(
    ("role", "path"),
    [
        ("gateway", "gateway.port"),
        ("all", "gateway.port"),
        ("config", "config_service.port"),
        ("sidecar", "sidecar.probe_port"),
    ],
)
def test_host_and_port_bind_each_roles_own_listener(role: str, path: str) -> None:
    assert flag_paths(role)["--port"] == path
    assert flag_paths(role)["--host"] == path.replace("port", "host")
    settings = load_role_settings(["--role", role, "--host", "127.0.0.1", "--port", "9000"], {})
    group, field = path.split(".")
    assert getattr(getattr(settings, group), field) == 9000
    assert getattr(getattr(settings, group), field.replace("port", "host")) == "127.0.0.1"


def test_the_container_roles_listen_on_every_interface_and_the_gateway_host_is_the_role_files_choice() -> None:
    def role(name: str) -> Settings:
        return load_role_settings(["--role", name], {})

    # Unset: each role file picks (tests/integration/test_listen_hosts.py binds them).
    assert role("all").gateway.host is None and role("gateway").gateway.host is None
    assert role("config").config_service.host == "0.0.0.0"
    assert role("sidecar").sidecar.probe_host == "0.0.0.0"
    assert load_role_settings(["--role", "all"], {"SIE_GATEWAY_HOST": "0.0.0.0"}).gateway.host == "0.0.0.0"
    assert load_role_settings(["--role", "sidecar", "--host", "::1"], {}).sidecar.probe_host == "::1"


def test_the_worker_socket_defaults_to_a_directory_of_this_users_own() -> None:
    runtime = load_role_settings(["--role", "worker"], {"XDG_RUNTIME_DIR": "/run/user/1000"})
    assert runtime.worker.socket_path == Path("/run/user/1000/sie/worker.sock")
    temp = load_role_settings(["--role", "sidecar"], {"TMPDIR": "/var/tmp"})
    assert temp.worker.socket_path == Path(f"/var/tmp/sie-{os.getuid()}/worker.sock")
    assert load_settings({}).worker.socket_path == Path(f"/tmp/sie-{os.getuid()}/worker.sock")
    given = load_role_settings(["--role", "worker", "--socket", "/srv/pod/w.sock"], {"XDG_RUNTIME_DIR": "/run/u"})
    assert given.worker.socket_path == Path("/srv/pod/w.sock")


def test_the_gateway_reads_the_heartbeat_period_its_first_round_is_measured_in() -> None:
    settings = load_role_settings(["--role", "gateway", "--health-interval-s", "3"], {})
    assert settings.sidecar.heartbeat_interval_s == 3.0


def test_the_worker_has_no_listener_to_bind() -> None:
    with pytest.raises(SettingsError, match="option --port does not apply to role 'worker'"):
        load_role_settings(["--role", "worker", "--port", "9000"], {})


def test_the_role_comes_from_the_flag_then_the_variable_then_all() -> None:
    assert load_role_settings(["--role=worker"], {"SIE_ROLE": "config"}).process.role == "worker"
    assert load_role_settings([], {"SIE_ROLE": "config"}).process.role == "config"
    assert load_role_settings([], {}).process.role == "all"
    with pytest.raises(SettingsError, match="SIE_ROLE='nope' is not allowed"):
        load_role_settings([], {"SIE_ROLE": "nope"})


def test_flags_map_to_setting_paths() -> None:
    assert parse_flags(["--role", "all", "--port=9000", "--log-format", "json", "--preload", "a,b"], "all") == {
        "process.role": "all",
        "gateway.port": "9000",
        "telemetry.log_format": "json",
        "worker.preload_models": "a,b",
    }
    with pytest.raises(SettingsError, match="needs a value"):
        parse_flags(["--port"], "all")


def test_the_huge_pages_environment_adds_the_tunable_once_and_only_on_glibc() -> None:
    """What `sie run` re-executes itself in: GLIBC_TUNABLES with malloc's huge-page tunable added to the operator's
    own tunables; nothing to do on another C library, or where a `glibc.malloc.hugetlb` value is set already (the
    re-executed process itself, or an operator's choice, kept)."""
    assert huge_pages_environment("glibc", {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
    }
    merged = huge_pages_environment("glibc", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert merged == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert huge_pages_environment("glibc", merged) is None
    assert huge_pages_environment("glibc", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert huge_pages_environment("", {}) is None  # musl, macOS: no glibc to tune


def test_huge_pages_are_asked_for_by_the_worker_role_unless_told_otherwise() -> None:
    """`auto` (the default): the worker role only (it runs models and serves no HTTP); `on` and `off` for every role."""
    assert load_settings({}).process.malloc_huge_pages == "auto"
    assert [role for role in ROLES if wants_huge_pages("auto", role)] == ["worker"]
    assert all(wants_huge_pages("on", role) and not wants_huge_pages("off", role) for role in ROLES)
