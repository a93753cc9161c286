"""What the e2e modules share, each started once per session: a real `sie run --role all` serving the baseline
catalogue plus one model that cannot load, one distributed deployment for the modules that need no options of their
own, and the public sie-sdk read from its wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator

import pytest

from launcher import REPO, Cluster, free_port, serving_all, serving_cluster

GHOST_MODEL = """\
sie_id: acme/ghost
weights_path: /nonexistent/acme-ghost
tasks: {encode: {dense: {dim: 8}}}
profiles:
  default: {adapter_path: 'sie.adapters.dense:OnnxDenseAdapter', max_batch_tokens: 1024}
"""
SDK_WHEEL = REPO / ".cache" / "wheels" / "sie_sdk-0.10.1-py3-none-any.whl"
MATRYOSHKA = "acme/minilm-matryoshka"


def matryoshka_variant() -> str:
    """all-MiniLM-L6-v2 served as `acme/minilm-matryoshka`, its dense vector declared truncatable (OpenAI
    `dimensions`): the weights are not Matryoshka-trained, but truncation and re-normalisation are the same."""
    text = (REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml").read_text()
    renamed = text.replace("sie_id: sentence-transformers/all-MiniLM-L6-v2", f"sie_id: {MATRYOSHKA}")
    declared = renamed.replace("    dense:\n      dim: 384\n", "    dense:\n      dim: 384\n      matryoshka: true\n")
    if declared.count("matryoshka: true") != 1 or MATRYOSHKA not in declared:
        raise RuntimeError("the MiniLM model YAML changed shape; update matryoshka_variant")
    return declared


# The KServe gRPC services of the shared all-in-one server and of the shared cluster's gateway (test_dialects.py).
ALL_SERVER_GRPC_PORT = free_port()
CLUSTER_GRPC_PORT = free_port()


@pytest.fixture(scope="session")
def all_server_grpc(all_server: str) -> str:
    """`host:port` of the shared all-in-one server's KServe V2 gRPC service."""
    return f"127.0.0.1:{ALL_SERVER_GRPC_PORT}"


@pytest.fixture()
def cluster_grpc(cluster: Cluster) -> str:
    """`host:port` of the shared cluster gateway's KServe V2 gRPC service."""
    return f"127.0.0.1:{CLUSTER_GRPC_PORT}"


@pytest.fixture(scope="session")
def all_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of an all-in-one server; on teardown it must exit 0 after SIGTERM (graceful shutdown)."""
    root = tmp_path_factory.mktemp("all-role")
    models = root / "models"
    shutil.copytree(REPO / "config" / "models", models)
    (models / "acme__ghost.yaml").write_text(GHOST_MODEL)
    (models / "acme__minilm-matryoshka.yaml").write_text(matryoshka_variant())
    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    # the models of TEI's root routes, for clients that drop a base URL's path (test_integrations.py)
    env = {"SIE_MODELS_DIR": str(models), "SIE_COMPAT_DEFAULT_MODELS": f"embed={minilm},rerank={minilm}",
           "SIE_GATEWAY_GRPC_PORT": str(ALL_SERVER_GRPC_PORT)}  # fmt: skip
    with serving_all(root / "server.log", ["--preload", minilm], env) as url:
        yield url


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """nats-server, worker (MiniLM preloaded), sidecar and gateway, for every e2e module that needs a plain distributed
    deployment; `elsewhere` is a deploy-owned queue pool no worker serves. Its catalogue is the baseline one plus
    a tiny random GLiNER, TINY_GLINER (its checkpoint under the cluster's root, `gliner/gliner`), a tiny CLIP and
    SigLIP, TINY_IMAGE_TEXT's (under `clip` and `siglip`), and a tiny open_clip SigLIP, TINY_OPEN_CLIP (under
    `open_clip`)."""
    from sie.catalog import dump_yaml
    from support.image_text_checkpoints import TINY_IMAGE_TEXT, image_text_yaml, save_image_text_model
    from support.open_clip_checkpoints import TINY_OPEN_CLIP, open_clip_yaml, save_open_clip_siglip
    from support.zero_shot_checkpoints import TINY_GLINER, save_gliner

    root = tmp_path_factory.mktemp("cluster")
    models = root / "models"
    shutil.copytree(REPO / "config" / "models", models)
    save_gliner(root / "gliner")
    entry = {"sie_id": TINY_GLINER, "weights_path": str(root / "gliner" / "gliner"), "tasks": {"extract": {}},
             "profiles": {"default": {"adapter_path": "sie_server.adapters.gliner:GLiNERAdapter",
                                      "max_batch_tokens": 4096}}}  # fmt: skip
    (models / "tiny__gliner.yaml").write_text(dump_yaml(entry))
    for family, sie_id in TINY_IMAGE_TEXT.items():
        save_image_text_model(root / family, family)
        (models / f"tiny__{family}.yaml").write_text(dump_yaml(image_text_yaml(family, sie_id, root / family)))
    save_open_clip_siglip(root / "open_clip")
    (models / "tiny__open-clip.yaml").write_text(dump_yaml(open_clip_yaml(TINY_OPEN_CLIP, root / "open_clip")))
    gateway_env = {"SIE_GATEWAY_STATIC_QUEUE_POOLS": "elsewhere", "SIE_GATEWAY_GRPC_PORT": str(CLUSTER_GRPC_PORT)}
    role_env = {"SIE_MODELS_DIR": str(models)}
    with serving_cluster(root, gateway_env=gateway_env, role_env=role_env) as deployment:
        yield deployment


@pytest.fixture
def cluster(shared_cluster: Cluster) -> Cluster:
    """The shared deployment, serving: a part an earlier test stopped or killed is started again first."""
    shared_cluster.revive()
    return shared_cluster


@pytest.fixture(scope="session")
def public_sdk(tmp_path_factory: pytest.TempPathFactory):
    """The public sie-sdk 0.10.1 read from its wheel (downloaded once, like `make test` does)."""
    if not SDK_WHEEL.exists():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python", "--quiet"]
        subprocess.run([*command, "-d", str(SDK_WHEEL.parent), "sie-sdk==0.10.1"], check=True, timeout=300)
    target = tmp_path_factory.mktemp("sie-sdk")
    with zipfile.ZipFile(SDK_WHEEL) as wheel:
        wheel.extractall(target)
    sys.path.insert(0, str(target))
    import sie_sdk

    return sie_sdk
