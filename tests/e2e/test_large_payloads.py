"""Large payloads through real processes (issue 13 §3): nats-server with a 64 KiB max_payload, `sie run --role
gateway|sidecar|worker`, and a local payload store both roles name in SIE_PAYLOAD_STORE_URL. Results far larger
than a broker message come back whole (result_chunk_v1), and items larger than one go through the store, which is
empty again afterwards, an image item larger than one too. Marked slow."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from launcher import REPO, Cluster, serving_cluster
from support.polling import holds_within

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MAX_PAYLOAD = 64 * 1024
LONG_TEXT = " ".join(f"word{index % 97} stands beside token{index % 89}" for index in range(300))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from sie.catalog import dump_yaml
    from support.image_text_checkpoints import TINY_IMAGE_TEXT, image_text_yaml, save_image_text_model

    root = tmp_path_factory.mktemp("large-payloads")
    models = root / "models"
    shutil.copytree(REPO / "config" / "models", models)
    save_image_text_model(root / "clip", "clip")
    (models / "tiny__clip.yaml").write_text(dump_yaml(image_text_yaml("clip", TINY_IMAGE_TEXT["clip"], root / "clip")))
    payloads = {"SIE_PAYLOAD_STORE_URL": str(root / "payloads")}
    role_env = {"SIE_MODELS_DIR": str(models)}
    with serving_cluster(root, broker_env=payloads, role_env=role_env, max_payload=MAX_PAYLOAD) as deployment:
        yield deployment


def test_a_multivector_encode_of_many_long_texts_comes_back_whole(cluster: Cluster) -> None:
    body = {
        "items": [{"id": f"t{index}", "text": f"{index} {LONG_TEXT}"} for index in range(16)],
        "params": {"output_types": ["multivector"], "options": {"profile": "multivector"}},
    }
    response = httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json=body, timeout=120)
    assert response.status_code == 200, f"{response.text}\n{cluster.logs()}"
    items = response.json()["items"]
    assert [item["id"] for item in items] == [f"t{index}" for index in range(16)]
    for item in items:
        vectors = np.asarray(item["multivector"]["values"], dtype=np.float32)
        assert vectors.shape[1] == 384 and vectors.nbytes > 5 * MAX_PAYLOAD  # only result chunks carry that


def test_items_larger_than_a_broker_message_go_through_the_payload_store(cluster: Cluster) -> None:
    items = [{"id": f"big-{index}", "text": f"{index} " + "lorem ipsum dolor sit amet " * 3000} for index in range(3)]
    response = httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json={"items": items}, timeout=120)
    assert response.status_code == 200, f"{response.text}\n{cluster.logs()}"
    assert [len(item["dense"]["values"]) for item in response.json()["items"]] == [384, 384, 384]
    assert (cluster.root / "payloads").is_dir()  # the gateway wrote there: no item this size fits a broker message

    def store_emptied() -> bool:
        return not any((cluster.root / "payloads").iterdir())

    assert holds_within(store_emptied, 10.0, interval_s=0.05), sorted(
        path.name for path in (cluster.root / "payloads").iterdir()
    )


def test_an_image_larger_than_a_broker_message_goes_through_the_payload_store(cluster: Cluster) -> None:
    """A 300×300 PNG of noise (about 270 kB) is published by reference; the sidecar fetches it back, prepares its
    pixels and the worker encodes them: one normalised vector, and the store is empty again."""
    import io

    from PIL import Image

    from support.image_text_checkpoints import TINY_IMAGE_TEXT

    pixels = np.random.default_rng(7).integers(0, 256, (300, 300, 3), dtype=np.uint8)
    big = io.BytesIO()
    Image.fromarray(pixels).save(big, format="PNG")
    assert len(big.getvalue()) > 2 * MAX_PAYLOAD
    url = f"{cluster.url}/v1/encode/{TINY_IMAGE_TEXT['clip']}"
    body = {"items": [{"images": [{"data": base64.b64encode(big.getvalue()).decode()}]}]}
    response = httpx.post(url, json=body, timeout=120)
    assert response.status_code == 200, f"{response.text}\n{cluster.logs()}"
    vector = response.json()["items"][0]["dense"]["values"]
    assert len(vector) == 24 and abs(np.linalg.norm(vector) - 1) < 1e-4

    def store_emptied() -> bool:
        return not any((cluster.root / "payloads").iterdir())

    assert holds_within(store_emptied, 10.0, interval_s=0.05)
