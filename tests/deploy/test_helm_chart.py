"""The Helm chart deploy/helm/sie, checked with the real helm binary (`helm lint`, `helm template`) and the
Kubernetes OpenAPI schemas (kubernetes-validate), for the default values and every values file in its ci/.

kubernetes-validate has no schemas for custom resources: KEDA's ScaledObject and TriggerAuthentication and the
prometheus-operator ServiceMonitor are checked by hand here, field by field, against the objects they point at.
Every env variable the chart sets goes through the settings loader of the container's role, the one `sie run`
uses, so a name no setting declares, a setting the role does not read or a value it would refuse fails here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sie.settings import SettingsError, describe_settings, load_role_settings
from support.helm import REPO, RenderError, render, run_helm

CHART = REPO / "deploy" / "helm" / "sie"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
VALUE_SETS = [None, *CI_VALUES]
VALUE_SET_IDS = ["defaults", *(path.stem for path in CI_VALUES)]
# The oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest the package has schemas for.
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CUSTOM_KINDS = {"ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
SECRET_PLACEHOLDER = "placeholder-token"
SCALING_PATH = "/v1/scaling/lanes"
LANE_VARIABLES = ("SIE_POOL", "SIE_MACHINE_PROFILE", "SIE_BUNDLE")
NATS_ENV = {"POD_NAME"}


@pytest.fixture(scope="module", params=VALUE_SETS, ids=VALUE_SET_IDS)
def values_file(request: pytest.FixtureRequest) -> Path | None:
    return request.param


@pytest.fixture(scope="module")
def manifests(values_file: Path | None) -> list[dict[str, Any]]:
    return render(CHART, *([values_file] if values_file else []))


def _values_path(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _of_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [manifest for manifest in manifests if manifest["kind"] == kind]


def _named(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {manifest["metadata"]["name"]: manifest for manifest in _of_kind(manifests, kind)}


def _containers(manifests: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every Deployment and StatefulSet."""
    for manifest in manifests:
        if manifest["kind"] in WORKLOAD_KINDS:
            pod = manifest["spec"]["template"]["spec"]
            for container in pod.get("initContainers", []) + pod["containers"]:
                yield manifest, container


def _sie_role(container: dict[str, Any]) -> str | None:
    """The role of a container running `sie run --role ROLE`; None for other images (NATS)."""
    arguments = container.get("args", [])
    if arguments[:2] == ["run", "--role"]:
        return arguments[2]
    return None


def _literal_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the process would see it, a placeholder standing in for each Secret value."""
    return {item["name"]: item.get("value", SECRET_PLACEHOLDER) for item in container.get("env", [])}


def _worker_deployments(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in _of_kind(manifests, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return container


def _lane(container: dict[str, Any]) -> tuple[str, str, str]:
    env = _literal_env(container)
    pool, profile, bundle = (env[name] for name in LANE_VARIABLES)
    return pool, profile, bundle


def _setting_default(env_name: str) -> str:
    (doc,) = [doc for doc in describe_settings() if doc.env == env_name]
    return doc.default


# --- helm's own checks ---


def test_helm_lint_passes_strictly(values_file: Path | None) -> None:
    arguments = ["lint", str(CHART), "--strict", *(["--values", str(values_file)] if values_file else [])]
    result = run_helm(*arguments)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# --- Kubernetes schemas ---


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_builtin_manifest_matches_the_kubernetes_schema(manifests: list[dict[str, Any]], version: str) -> None:
    checked = 0
    for manifest in manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            continue  # no schema in kubernetes-validate: test_custom_resources_point_at_rendered_objects
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']} on Kubernetes {version}: {exc.message}")
        checked += 1
    assert checked > 0


def test_the_schema_check_catches_a_broken_manifest(manifests: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(_of_kind(manifests, "Deployment")[0])
    broken["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="envv"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_custom_resources_point_at_rendered_objects(manifests: list[dict[str, Any]]) -> None:
    deployments = _named(manifests, "Deployment")
    services = _of_kind(manifests, "Service")
    trigger_auths = _named(manifests, "TriggerAuthentication")
    scaled_objects = _of_kind(manifests, "ScaledObject")
    for scaled in scaled_objects:
        _check_scaled_object(scaled, deployments, services, trigger_auths)
    # A Deployment without replicas is KEDA's to scale: exactly one ScaledObject targets it.
    targets = sorted(scaled["spec"]["scaleTargetRef"]["name"] for scaled in scaled_objects)
    assert targets == sorted(name for name, d in deployments.items() if "replicas" not in d["spec"])
    for monitor in _of_kind(manifests, "ServiceMonitor"):
        _check_service_monitor(monitor, services)
    for trigger_auth in trigger_auths.values():
        assert trigger_auth["apiVersion"] == "keda.sh/v1alpha1"
        (ref,) = trigger_auth["spec"]["secretTargetRef"]
        assert ref["parameter"] == "token" and ref["name"] and ref["key"]


def _check_scaled_object(
    scaled: dict[str, Any],
    deployments: dict[str, dict[str, Any]],
    services: list[dict[str, Any]],
    trigger_auths: dict[str, dict[str, Any]],
) -> None:
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "triggers",
    }
    target = spec["scaleTargetRef"]
    assert target["apiVersion"] == "apps/v1" and target["kind"] == "Deployment"
    deployment = deployments[target["name"]]
    assert "replicas" not in deployment["spec"], "a KEDA-managed Deployment must leave replicas to the HPA"
    assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] and spec["maxReplicaCount"] >= 1
    assert isinstance(spec["pollingInterval"], int) and isinstance(spec["cooldownPeriod"], int)
    pool, profile, bundle = _lane(_container(deployment, "worker"))
    assert _lane(_container(deployment, "sidecar")) == (pool, profile, bundle)
    triggers = spec["triggers"]
    assert [trigger["name"] for trigger in triggers] == ["demand", "warm-floor"]
    for trigger in triggers:
        assert set(trigger) <= {"type", "name", "metricType", "metadata", "authenticationRef"}
        assert trigger["metricType"] == "AverageValue"
        metadata = trigger["metadata"]
        assert all(isinstance(value, str) for value in metadata.values()), "KEDA trigger metadata values are strings"
        if trigger["type"] == "metrics-api":
            gateway = next(s for s in services if s["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway")
            host = f"http://{gateway['metadata']['name']}.{scaled['metadata'].get('namespace', 'sie')}.svc."
            assert metadata["url"].startswith(host)
            assert metadata["url"].endswith(
                f":{gateway['spec']['ports'][0]['port']}{SCALING_PATH}/{pool}/{profile}/{bundle}"
            )
            assert metadata["valueLocation"] == {"demand": "demand", "warm-floor": "warm_floor"}[trigger["name"]]
            assert int(metadata["targetValue"]) >= 1 and metadata["format"] == "json"
            if "authenticationRef" in trigger:
                assert metadata["authMode"] == "bearer" and trigger["authenticationRef"]["name"] in trigger_auths
        else:
            assert trigger["type"] == "prometheus"
            assert metadata["serverAddress"].startswith("http")
            selector = f'pool="{pool}",machine_profile="{profile}",bundle="{bundle}"'
            series = {"demand": ["sie_gateway_lane_pending_demand", "sie_gateway_lane_queue_depth"],
                      "warm-floor": ["sie_gateway_pool_warm_floor"]}[trigger["name"]]  # fmt: skip
            for name in series:
                assert f"{name}{{{selector}}}" in metadata["query"]
            assert "or vector(0)" in metadata["query"] and int(metadata["threshold"]) >= 1


def _check_service_monitor(monitor: dict[str, Any], services: list[dict[str, Any]]) -> None:
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]
    (expression,) = selector["matchExpressions"]
    selected = [
        service
        for service in services
        if selector["matchLabels"].items() <= service["metadata"]["labels"].items()
        and service["metadata"]["labels"][expression["key"]] in expression["values"]
    ]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected} == {"gateway", "config", "worker"}
    port_names = {port["name"] for service in selected for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
        assert set(endpoint) <= {"port", "path", "interval", "authorization"}


# --- the chart against the code it deploys ---


def _env_problems(manifests: list[dict[str, Any]]) -> tuple[list[str], set[str]]:
    """One line per env variable no setting of the container's role declares, and the roles seen."""
    declared = describe_settings()
    roles_by_name = {name: set(doc.roles) for doc in declared for name in (doc.env, *doc.aliases)}
    problems, seen_roles = [], set()
    for workload, container in _containers(manifests):
        role = _sie_role(container)
        where = f"{workload['metadata']['name']}/{container['name']}"
        names = [item["name"] for item in container.get("env", [])]
        if role is None:  # the NATS server reads only its pod's name (a cluster node's server name)
            allowed = NATS_ENV if container["image"].startswith("nats:") else set()
            problems += [f"{where} is no SIE container but sets {name}" for name in names if name not in allowed]
            continue
        seen_roles.add(role)
        problems += [f"{where} sets {name} twice" for name in sorted(set(names)) if names.count(name) > 1]
        problems += [f"{where} sets {name}, which no setting declares" for name in names if name not in roles_by_name]
        problems += [
            f"{where} sets {name}, which role {role} does not read"
            for name in names
            if name in roles_by_name and role not in roles_by_name[name]
        ]
        # The loader `sie run` uses: bad values, unknown flags and unknown variables stop it (other roles' variables
        # are only ignored by the loader, so the check above refuses them).
        try:
            load_role_settings(container["args"][1:], _literal_env(container))
        except SettingsError as exc:
            problems += [f"{where}: {problem}" for problem in exc.problems]
    return problems, seen_roles


def test_every_env_variable_is_a_setting_of_the_containers_role(manifests: list[dict[str, Any]]) -> None:
    problems, seen_roles = _env_problems(manifests)
    assert not problems, "\n".join(problems)
    assert seen_roles == {"gateway", "config", "sidecar", "worker"}


def test_the_env_check_refuses_unknown_and_foreign_variables(tmp_path: Path) -> None:
    values = "gateway:\n  extraEnv:\n    SIE_NOT_A_SETTING: x\n    SIE_CONFIG_RESTORE: 'true'\n"
    problems, _ = _env_problems(render(CHART, _values_path(tmp_path, values)))
    gateway = "sie-test-gateway/gateway"
    assert f"{gateway} sets SIE_NOT_A_SETTING, which no setting declares" in problems
    assert f"{gateway} sets SIE_CONFIG_RESTORE, which role gateway does not read" in problems


def test_ports_and_probes_are_the_roles_own(manifests: list[dict[str, Any]]) -> None:
    listen = {"gateway": "SIE_GATEWAY_PORT", "config": "SIE_CONFIG_PORT", "sidecar": "SIE_WORKER_PROBE_PORT"}
    for workload, container in _containers(manifests):
        role = _sie_role(container)
        if role == "worker":
            assert "ports" not in container  # it serves the Unix socket only; the sidecar's /readyz covers it
            continue
        if role is None:
            continue
        (port,) = container["ports"]
        assert port["containerPort"] == int(_setting_default(listen[role])), workload["metadata"]["name"]
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
        for probe in ("livenessProbe", "startupProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}


def test_worker_pods_share_the_socket_and_the_lane(manifests: list[dict[str, Any]]) -> None:
    for deployment in _worker_deployments(manifests):
        pod = deployment["spec"]["template"]["spec"]
        sidecar, worker = _container(deployment, "sidecar"), _container(deployment, "worker")
        assert _lane(sidecar) == _lane(worker)
        socket = _literal_env(sidecar)["SIE_IPC_SOCKET_PATH"]
        assert _literal_env(worker)["SIE_IPC_SOCKET_PATH"] == socket
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts = [
            {m["name"] for m in c["volumeMounts"] if socket.startswith(m["mountPath"].rstrip("/") + "/")}
            for c in (sidecar, worker)
        ]
        assert mounts[0] == mounts[1] and len(mounts[0]) == 1
        assert "emptyDir" in volumes[mounts[0].pop()]
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        lane = (
            annotations["sie.dev/queue-pool"],
            annotations["sie.dev/machine-profile"],
            annotations["sie.dev/bundle"],
        )
        assert lane == _lane(worker)


def test_gateway_knows_the_lanes_the_workers_serve(manifests: list[dict[str, Any]]) -> None:
    lanes = [_lane(_container(d, "worker")) for d in _worker_deployments(manifests)]
    assert len(lanes) == len(set(lanes)) > 0
    for _, container in _containers(manifests):
        if _sie_role(container) != "gateway":
            continue
        env = _literal_env(container)
        assert env["SIE_GATEWAY_CONFIGURED_GPUS"].split(",") == sorted({profile for _, profile, _ in lanes})
        static = sorted({pool for pool, _, _ in lanes if pool != "default"})
        assert env.get("SIE_GATEWAY_STATIC_QUEUE_POOLS", "").split(",") == (static or [""])
        assert ("default", env["SIE_MACHINE_PROFILE"]) in {(pool, profile) for pool, profile, _ in lanes}


def test_gpu_lanes_are_canonical_and_get_gpus() -> None:
    manifests = render(CHART, CHART / "ci" / "gpu-keda-s3.yaml")
    workers = {d["metadata"]["labels"]["sie.dev/worker"]: d for d in _worker_deployments(manifests)}
    assert _lane(_container(workers["l4-acme"], "worker")) == ("customer-acme", "l4", "default")
    limits = _container(workers["a100-sglang"], "worker")["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 2
    assert "nvidia.com/gpu" not in _container(workers["cpu"], "worker")["resources"].get("limits", {})
    assert "nodeSelector" not in workers["cpu"]["spec"]["template"]["spec"]  # the entry's {} replaces the default
    assert _container(workers["cpu"], "worker")["image"].endswith(":0.1.0")
    assert _container(workers["l4"], "worker")["image"].endswith(":0.1.0-cuda")


def test_the_grpc_service_gets_its_port_setting_and_service_port(tmp_path: Path) -> None:
    manifests = render(CHART, _values_path(tmp_path, "gateway:\n  grpc:\n    enabled: true\n    port: 9001\n"))
    (gateway,) = [container for _, container in _containers(manifests) if _sie_role(container) == "gateway"]
    assert _literal_env(gateway)["SIE_GATEWAY_GRPC_PORT"] == "9001"
    assert {"name": "grpc", "containerPort": 9001} in gateway["ports"]
    (service,) = [svc for svc in _of_kind(manifests, "Service") if svc["metadata"]["name"].endswith("gateway")]
    assert {"name": "grpc", "port": 9001, "targetPort": "grpc"} in service["spec"]["ports"]
    assert not _env_problems(manifests)[0]
    for manifest in manifests:
        if manifest["kind"] in ("Deployment", "Service"):
            kubernetes_validate.validate(manifest, KUBERNETES_VERSIONS[0], strict=True)
    default = render(CHART)
    assert all("SIE_GATEWAY_GRPC_PORT" not in _literal_env(c) for _, c in _containers(default))


def test_external_nats_replaces_the_bundled_server() -> None:
    manifests = render(CHART, CHART / "ci" / "external-nats.yaml")
    assert not _of_kind(manifests, "StatefulSet")
    for _, container in _containers(manifests):
        env = _literal_env(container)
        if _sie_role(container) in {"gateway", "config", "sidecar"}:
            assert env["SIE_NATS_URL"] == "nats://nats.messaging.svc:4222"
            assert {"SIE_NATS_USER", "SIE_NATS_PASSWORD"} <= env.keys()


def test_bundled_nats_runs_jetstream_on_its_volume() -> None:
    manifests = render(CHART)
    (nats,) = _of_kind(manifests, "StatefulSet")
    (container,) = nats["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("nats:")
    arguments = container["args"]
    assert "-js" in arguments and arguments[arguments.index("-sd") + 1] == "/data"
    (claim,) = nats["spec"]["volumeClaimTemplates"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]
    services = _named(manifests, "Service")
    assert nats["spec"]["serviceName"] in services


def test_nats_replicas_make_a_jetstream_cluster_the_roles_reach_and_replicate_on() -> None:
    manifests = render(CHART, CHART / "ci" / "nats-cluster.yaml")
    (nats,) = _of_kind(manifests, "StatefulSet")
    name, headless = nats["metadata"]["name"], nats["spec"]["serviceName"]
    assert (nats["spec"]["replicas"], nats["spec"]["podManagementPolicy"]) == (3, "Parallel")
    pod = nats["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    arguments = container["args"]
    assert arguments[arguments.index("--server_name") + 1] == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    assert arguments[arguments.index("--cluster") + 1] == "nats://0.0.0.0:6222"
    routes = arguments[arguments.index("--routes") + 1].split(",")
    assert routes == [f"nats://{name}-{index}.{headless}:6222" for index in range(3)]
    assert {"name": "cluster", "containerPort": 6222} in container["ports"]
    headless_ports = {port["name"]: port["port"] for port in _named(manifests, "Service")[headless]["spec"]["ports"]}
    assert headless_ports["cluster"] == 6222
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert anti["labelSelector"]["matchLabels"] == nats["spec"]["selector"]["matchLabels"]
    budget = _named(manifests, "PodDisruptionBudget")[name]
    assert budget["spec"]["maxUnavailable"] == 1  # two of three keep the quorum
    assert budget["spec"]["selector"] == nats["spec"]["selector"]
    for _, container in _containers(manifests):
        role = _sie_role(container)
        env = _literal_env(container)
        if role in {"gateway", "config", "sidecar"}:
            assert env["SIE_NATS_URL"].split(",") == [f"nats://{name}-{index}.{headless}:4222" for index in range(3)]
        if role in {"gateway", "sidecar"}:
            assert env["SIE_STREAM_REPLICAS"] == "3"


def test_a_single_nats_server_keeps_single_replica_streams_and_no_budget() -> None:
    manifests = render(CHART)
    (nats,) = _of_kind(manifests, "StatefulSet")
    assert nats["spec"]["replicas"] == 1 and "--routes" not in nats["spec"]["template"]["spec"]["containers"][0]["args"]
    assert nats["metadata"]["name"] not in _named(manifests, "PodDisruptionBudget")
    replicas = {_literal_env(c)["SIE_STREAM_REPLICAS"] for _, c in _containers(manifests) if _sie_role(c) == "gateway"}
    assert replicas == {"1"}


def test_auth_from_an_existing_secret_is_never_written() -> None:
    manifests = render(CHART, CHART / "ci" / "auth-existing-secret.yaml")
    assert not _of_kind(manifests, "Secret")
    refs = [
        item["valueFrom"]["secretKeyRef"]
        for _, container in _containers(manifests)
        for item in container.get("env", [])
        if "valueFrom" in item
    ]
    assert refs and {ref["name"] for ref in refs} == {"sie-tokens"}
    assert {ref["key"] for ref in refs} == {"admin", "inference"}


def _value_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _value_paths(value, path + ".")
        else:
            yield path


def test_every_value_is_documented_in_the_chart_readme() -> None:
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    undocumented = []
    for path in _value_paths(values):
        prefixes = [".".join(path.split(".")[:length]) for length in range(1, path.count(".") + 2)]
        if not any(f"`{prefix}`" in readme for prefix in prefixes):
            undocumented.append(path)
    assert not undocumented, f"values missing from deploy/helm/sie/README.md: {undocumented}"


# --- values the chart refuses ---

BAD_VALUES = {
    "blank-queue-pool": (
        "workers:\n  cpu:\n    machineProfile: cpu\n    queuePool: '  '\n",
        "workers.cpu.queuePool is blank",
    ),
    "token-with-dot": (
        "workers:\n  cpu:\n    machineProfile: l4.spot\n",
        'workers.cpu.machineProfile "l4.spot" may hold only',
    ),
    "token-too-long": (
        f"workers:\n  cpu:\n    machineProfile: cpu\n    bundle: {'b' * 64}\n",
        "longer than 63 characters",
    ),
    "tuple-collision": (
        "workers:\n  cpu:\n    machineProfile: cpu\n  cpu-two:\n    machineProfile: ' CPU '\n    queuePool: Default\n",
        "workers.cpu and workers.cpu-two both serve the lane default/cpu/default",
    ),
    "key-not-dns-label": ("workers:\n  GPU_L4:\n    machineProfile: l4\n", "must be a lowercase DNS-1123 label"),
    "unknown-worker-key": (
        "workers:\n  cpu:\n    machineProfile: cpu\n    replica: 2\n",
        "workers.cpu.replica is not a worker setting",
    ),
    "missing-machine-profile": ("workers:\n  gpu:\n    bundle: default\n", "workers.gpu.machineProfile is required"),
    "fractional-gpus": (
        "workers:\n  cpu:\n    machineProfile: cpu\n    gpus: 0.5\n",
        "workers.cpu.gpus must be a whole number",
    ),
    "default-profile-unserved": (
        "gateway:\n  defaultMachineProfile: l4\n",
        'gateway.defaultMachineProfile "l4" has no worker',
    ),
    "token-mode-without-tokens": ("auth:\n  mode: token\n", "auth.mode=token needs inference tokens"),
    "tokens-in-two-places": ("auth:\n  existingSecret: s\n  adminToken: a\n", "exclude each other"),
    "store-url-not-object-store": ("config:\n  store:\n    type: url\n    url: /data\n", "s3://bucket"),
    "external-nats-without-url": ("nats:\n  enabled: false\n", "nats.enabled=false needs nats.url"),
    "prometheus-without-server": ("keda:\n  enabled: true\n  trigger: prometheus\n", "keda.prometheus.serverAddress"),
    "memory-pool-store-replicated": ("gateway:\n  poolStore: memory\n", "gateway.poolStore=memory"),
    "nats-replicas-even": ("nats:\n  replicas: 2\n", "nats.replicas 2 must be 1 or an odd whole number >= 3"),
    "nats-replicas-zero": ("nats:\n  replicas: 0\n", "nats.replicas 0 must be 1 or an odd"),
    "stream-replicas-over-servers": (
        "nats:\n  replicas: 3\n  streamReplicas: 5\n",
        "nats.streamReplicas 5 exceeds the 3 bundled NATS servers",
    ),
    "stream-replicas-over-limit": (
        "nats:\n  enabled: false\n  url: nats://n:4222\n  streamReplicas: 7\n",
        "nats.streamReplicas 7 must be 0 (follow nats.replicas) or 1..5",
    ),
}


@pytest.mark.parametrize(("values", "message"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_fail_rendering(tmp_path: Path, values: str, message: str) -> None:
    with pytest.raises(RenderError) as raised:
        render(CHART, _values_path(tmp_path, values))
    assert message in raised.value.message
