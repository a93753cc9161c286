"""Distributed mode with real processes: nats-server, `sie run --role gateway|sidecar|worker`. Covers the
whole path (zero-shot extraction with each request's labels too), PROVISIONING for a lane without workers,
redelivery after a worker crash, and 503 when the gateway loses NATS (last test: it stops the broker). Marked
slow."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import httpx
import nats
import numpy as np
import openai
import pytest

from launcher import Cluster
from sie.catalog.names import work_pool_stream_name
from support.image_text_checkpoints import TINY_IMAGE_TEXT
from support.polling import eventually, holds_within
from support.zero_shot_checkpoints import TINY_GLINER

pytestmark = pytest.mark.slow

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM = "HuggingFaceTB/SmolLM2-135M-Instruct"
HELLO_WORLD_PREFIX = [-0.034477, 0.031023, 0.006735, 0.026109]


@pytest.fixture(scope="module")
def two_device_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A worker pod with two CPU children (`--devices cpu:2`) behind its sidecar."""
    deployment = Cluster(tmp_path_factory.mktemp("two-devices"), worker_args=("--devices", "cpu:2"))
    try:
        deployment.wait_serving()
        yield deployment
    finally:
        deployment.close()


def test_a_two_device_pod_serves_from_both_children_and_shows_it_on_its_probe_port(
    two_device_cluster: Cluster,
) -> None:
    cluster = two_device_cluster
    with httpx.Client(timeout=60) as client:

        def both_ready() -> bool:
            children = client.get(f"{cluster.probe_url}/v1/placement").json()["children"]
            return [child["ready"] for child in children] == [True, True]

        assert holds_within(both_ready, 60.0, interval_s=0.2), cluster.sidecar.log()
        for index in range(12):
            body = {"items": [{"text": f"sentence {index}"}]}
            assert client.post(f"{cluster.url}/v1/encode/{MINILM}", json=body).status_code == 200
        state = client.get(f"{cluster.probe_url}/v1/placement").json()
        assert [child["name"] for child in state["children"]] == ["worker-0", "worker-1"]
        (model,) = [entry for entry in state["models"] if entry["model"] == MINILM]
        routed = {replica["worker"]: replica["routed_batches"] for replica in model["replicas"]}
        assert routed.get("worker-0", 0) > 0 and routed.get("worker-1", 0) > 0, routed
        metrics = client.get(f"{cluster.probe_url}/metrics").text
        assert 'sie_placement_worker_ready{device="cpu",worker="worker-1"} 1.0' in metrics
        assert client.get(f"{cluster.probe_url}/readyz").status_code == 200

        def listed_on_both() -> bool:  # the heartbeats carry where each model runs to the gateway's /v1/models
            loaded_on = client.get(f"{cluster.url}/v1/models/{MINILM}").json()["loaded_on"]
            return len(loaded_on) == 2 and all((w["device"], w["precision"]) == ("cpu", "float32") for w in loaded_on)

        assert holds_within(listed_on_both, 30.0, interval_s=0.2), client.get(f"{cluster.url}/v1/models/{MINILM}").text


def test_encode_score_extract_through_the_whole_path(cluster: Cluster) -> None:
    encoded = httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json={"items": [{"text": "Hello world"}]}, timeout=60)
    assert encoded.status_code == 200
    assert np.allclose(encoded.json()["items"][0]["dense"]["values"][:4], HELLO_WORLD_PREFIX, atol=1e-5)
    scored = httpx.post(
        f"{cluster.url}/v1/score/rasyosef/splade-tiny",
        json={
            "query": {"text": "capital of France"},
            "items": [{"text": "Berlin"}, {"id": "p", "text": "Paris, France"}],
        },
        timeout=60,
    )
    assert scored.status_code == 200 and scored.json()["scores"][0]["item_id"] == "p"
    extracted = httpx.post(
        f"{cluster.url}/v1/extract/nationaldesignstudio/rampart",
        json={"items": [{"text": "My name is Tim Cook."}]},
        timeout=60,
    )
    assert extracted.status_code == 200
    assert ("GIVEN_NAME", "Tim") in {(e["label"], e["text"]) for e in extracted.json()["items"][0]["entities"]}
    health = httpx.get(f"{cluster.url}/health", timeout=10).json()
    assert health["type"] == "gateway" and any(w["name"] == "w-1" for w in health["workers"])


def encode_on_lane(cluster: Cluster, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json={"items": [{"text": "x"}]}, headers=headers, timeout=30)


def generation_sequences(metrics_url: str) -> float:
    """`sie_worker_generation_sequences` summed over its series (decoding and waiting) at `metrics_url`."""
    text = httpx.get(metrics_url, timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("sie_worker_generation_sequences{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_gliner_model_extracts_each_requests_labels_over_nats(cluster: Cluster, public_sdk) -> None:
    from gliner import GLiNER

    texts = ["Steve Jobs founded Apple in Cupertino California in 1976.", "Marie Curie won the Nobel Prize."]
    client = public_sdk.SIEClient(cluster.url, timeout_s=120)
    try:
        results = client.extract(TINY_GLINER, [{"text": t} for t in texts], labels=["person", "city"],
                                 options={"threshold": 0.27}, wait_for_capacity=True)  # fmt: skip
        awarded = client.extract(TINY_GLINER, [{"text": texts[1]}], labels=["award", "person"],
                                 options={"threshold": 0.27, "flat_ner": False}, wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    reference = GLiNER.from_pretrained(str(cluster.root / "gliner" / "gliner"), local_files_only=True)
    expected = reference.inference(texts, ["person", "city"], threshold=0.27)
    expected += reference.inference(texts[1:], ["award", "person"], threshold=0.27, flat_ner=False)
    assert any(expected)
    for result, theirs in zip([*results, *awarded], expected, strict=True):
        ours = result["entities"]
        assert [(e["start"], e["end"], e["label"]) for e in ours] == [
            (e["start"], e["end"], e["label"]) for e in theirs
        ]
        assert np.allclose([e["score"] for e in ours], [e["score"] for e in theirs], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", sorted(TINY_IMAGE_TEXT))
def test_the_public_sdk_encodes_a_pil_image_and_a_text_over_nats(cluster: Cluster, public_sdk, family: str) -> None:
    """The SDK sends a PIL image as JPEG bytes; the sidecar prepares its pixels, the worker encodes them: the vectors
    equal transformers' on the same JPEG, the text's too, and a bomb is refused before anything is queued."""
    import io

    import torch
    import transformers
    from PIL import Image

    from support.image_text_checkpoints import image_processor

    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8), "RGB")
    model_id = TINY_IMAGE_TEXT[family]
    client = public_sdk.SIEClient(cluster.url, timeout_s=120)
    try:
        pictured, written = client.encode(model_id, [{"images": [image]}, {"text": "w5 w9 w10"}],
                                          wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    directory = cluster.root / family
    reference = (transformers.CLIPModel if family == "clip" else transformers.SiglipModel).from_pretrained(directory)
    sent = io.BytesIO()
    image.save(sent, format="JPEG", quality=95)  # what the SDK sends for a PIL image
    pixels = image_processor(family)([Image.open(io.BytesIO(sent.getvalue()))], return_tensors="np")["pixel_values"]
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    with torch.no_grad():
        image_vector = reference.get_image_features(pixel_values=torch.tensor(pixels)).pooler_output.numpy()[0]
        if family == "clip":
            text_vector = reference.get_text_features(**tokenizer(["w5 w9 w10"], return_tensors="pt"))
        else:
            ids = tokenizer(["w5 w9 w10"], padding="max_length", max_length=16, return_tensors="pt")["input_ids"]
            text_vector = reference.get_text_features(input_ids=ids)
    text_vector = text_vector.pooler_output.numpy()[0]
    if family == "clip":  # its YAML normalises
        image_vector, text_vector = (
            image_vector / np.linalg.norm(image_vector),
            text_vector / np.linalg.norm(text_vector),
        )
    assert np.allclose(pictured["dense"], image_vector, atol=1e-4, rtol=0)
    assert np.allclose(written["dense"], text_vector, atol=1e-4, rtol=0)
    bomb = io.BytesIO()
    Image.new("1", (12000, 12000)).save(bomb, format="PNG")  # 144 M pixels in a few kB
    payload = {"items": [{"text": "a"}, {"images": [{"data": base64.b64encode(bomb.getvalue()).decode()}]}]}
    refused = httpx.post(f"{cluster.url}/v1/encode/{model_id}", json=payload, timeout=30)
    assert refused.status_code == 400 and "Image 0 of item 1" in refused.text, refused.text


def test_the_public_sdk_encodes_with_an_open_clip_siglip_over_nats(cluster: Cluster, public_sdk) -> None:
    """An open_clip-layout SigLIP (the Marqo YAMLs' shape): the sidecar tokenizes with open_clip's text cleaning and
    prepares the JPEG the SDK sends; the vectors equal open_clip's own on the same JPEG and text."""
    import io

    import torch
    from PIL import Image

    from support.open_clip_checkpoints import TINY_OPEN_CLIP, load_reference

    rng = np.random.default_rng(4)
    image = Image.fromarray(rng.integers(0, 256, (30, 52, 3), dtype=np.uint8), "RGB")
    text = "Men's  SLIM_fit Jeans (dark blue)!"
    client = public_sdk.SIEClient(cluster.url, timeout_s=120)
    try:
        pictured, written = client.encode(TINY_OPEN_CLIP, [{"images": [image]}, {"text": text}],
                                          wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    model, preprocess, tokenizer = load_reference(cluster.root / "open_clip")
    sent = io.BytesIO()
    image.save(sent, format="JPEG", quality=95)  # what the SDK sends for a PIL image
    with torch.no_grad():
        image_vector = model.encode_image(preprocess(Image.open(io.BytesIO(sent.getvalue())))[None])[0].numpy()
        text_vector = model.encode_text(tokenizer([text]))[0].numpy()
    assert np.allclose(pictured["dense"], image_vector / np.linalg.norm(image_vector), atol=1e-4, rtol=0)
    assert np.allclose(written["dense"], text_vector / np.linalg.norm(text_vector), atol=1e-4, rtol=0)


def test_generation_streams_over_nats_and_a_client_leaving_cancels_it(cluster: Cluster) -> None:
    """Chat completions through gateway → JetStream → sidecar → worker IPC and back as streamed chunks on the
    gateway's inbox; a client that leaves mid-stream is cancelled through `cancel.{router}.{request}` →
    SignalGenerateCancel, and the worker frees the sequence (its gauge on the sidecar's /metrics)."""
    with openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", timeout=120, max_retries=0) as client:
        question = [{"role": "user", "content": "What is the capital of France?"}]
        stream = client.chat.completions.create(
            model=SMOLLM, messages=question, temperature=0, max_tokens=32, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert "Paris" in text, cluster.logs()
        buffered = client.chat.completions.create(model=SMOLLM, messages=question, temperature=0, max_tokens=32)
        assert buffered.choices[0].message.content == text and buffered.choices[0].finish_reason == "stop"
        story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
        decoding_while_read = 0.0
        with client.chat.completions.create(model=SMOLLM, messages=story, max_tokens=800, stream=True) as long_stream:
            for index, _chunk in enumerate(long_stream):
                if index == 3:
                    decoding_while_read = generation_sequences(f"{cluster.probe_url}/metrics")
                    break
        assert decoding_while_read >= 1
        freed = holds_within(lambda: generation_sequences(f"{cluster.probe_url}/metrics") == 0, 15.0, interval_s=0.2)
        assert freed, cluster.logs()


def test_a_lane_without_workers_is_provisioning(cluster: Cluster) -> None:
    # The default machine profile in a queue pool no worker serves: capacity may come, so retry later.
    response = encode_on_lane(cluster, {"X-SIE-Pool": "elsewhere"})
    assert response.status_code == 503
    assert response.headers["x-sie-error-code"] == "PROVISIONING" and response.headers["retry-after"] == "60"


def test_a_machine_profile_no_worker_has_is_a_400(cluster: Cluster) -> None:
    # No worker was heard on it and the gateway configures no GPUs: no capacity can come, so retrying is pointless.
    response = encode_on_lane(cluster, {"X-SIE-MACHINE-PROFILE": "h100"})
    assert response.status_code == 400
    assert response.json()["detail"]["requested_profile"] == "h100"


FILLER = "the quick brown fox jumps over the lazy dog while the band plays on the corner of the street"
REQUESTS = 200
ITEMS = 3


async def published_work_items(broker: nats.NATS) -> int:
    """The pool stream's last sequence number: how many work items the gateway has published so far."""
    info = await broker.jetstream().stream_info(work_pool_stream_name("default"))
    return info.state.last_seq


def test_killing_the_worker_loses_no_accepted_request(cluster: Cluster) -> None:
    async def scenario() -> tuple[list[httpx.Response], int]:
        broker = await nats.connect(cluster.nats_url)
        try:
            before = await published_work_items(broker)
            # One connection per request, so all of them are sent at once.
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=REQUESTS)) as client:
                calls = [
                    asyncio.ensure_future(
                        client.post(
                            f"{cluster.url}/v1/encode/{MINILM}",
                            json={"items": [{"id": f"r{i}-{j}", "text": f"{i} {j} {FILLER}"} for j in range(ITEMS)]},
                        )
                    )
                    for i in range(REQUESTS)
                ]

                # Kill the worker once every request is accepted (all its work items are in the stream).
                async def all_accepted() -> bool:
                    return await published_work_items(broker) - before >= REQUESTS * ITEMS

                await eventually(all_accepted, timeout_s=30, what="the gateway to accept every request")
                cluster.worker.process.kill()
                answered_before_kill = sum(call.done() for call in calls)
                cluster.worker.stop()  # reaps the killed process and closes its log
                cluster.start("worker")
                return list(await asyncio.gather(*calls)), answered_before_kill
        finally:
            await broker.close()

    responses, answered_before_kill = asyncio.run(scenario())
    # Not vacuous: most requests were still unanswered when the worker died.
    assert answered_before_kill < REQUESTS // 2
    refused = [(index, r.status_code, r.text) for index, r in enumerate(responses) if r.status_code != 200]
    assert not refused, refused[:3]
    for index, response in enumerate(responses):
        ids = [item["id"] for item in response.json()["items"]]
        assert ids == [f"r{index}-{j}" for j in range(ITEMS)]  # each item answered once, in place


def test_a_worker_killed_mid_generation_ends_the_stream_with_an_error_and_the_next_generation_runs(
    cluster: Cluster,
) -> None:
    """A generation already streaming cannot be given to another worker (its client holds part of one answer, and a
    second attempt would write a different one): the sidecar ends it with an error event, so nothing hangs. The
    restarted worker serves the next generation."""
    with openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", timeout=60, max_retries=0) as client:
        story = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
        received = 0
        with (
            pytest.raises(openai.APIError, match="the generation failed on the worker"),
            client.chat.completions.create(model=SMOLLM, messages=story, max_tokens=800, stream=True) as stream,
        ):
            for _chunk in stream:
                received += 1
                if received == 3:
                    cluster.worker.process.kill()
        assert 3 <= received < 800
        cluster.worker.stop()  # reaps the killed process and closes its log
        cluster.start("worker")
        question = [{"role": "user", "content": "What is the capital of France?"}]
        reply = client.with_options(timeout=120).chat.completions.create(
            model=SMOLLM, messages=question, temperature=0, max_tokens=32
        )
        assert "Paris" in reply.choices[0].message.content, cluster.logs()


def test_losing_nats_answers_503(cluster: Cluster) -> None:
    cluster.stop("nats")
    response = httpx.post(f"{cluster.url}/v1/encode/{MINILM}", json={"items": [{"text": "x"}]}, timeout=30)
    assert response.status_code == 503
