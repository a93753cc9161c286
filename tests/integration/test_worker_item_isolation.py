"""One bad item fails alone (issue 14 §1): a real WorkerService with the real MiniLM model behind IpcServer,
sent RunBatch frames through UdsWorkerClient.

The poison is what a direct publisher (or an older sidecar) can send: prepared tokens that claim the
model's tokenizer but hold an id outside its vocabulary, so onnxruntime's embedding Gather raises for any
run that includes the item. Its batch-mates must still get exactly what they get alone.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from sie.ipc.server import IpcServer
from sie.ipc.uds_client import UdsWorkerClient
from sie.settings import BatchingSettings, LaneSettings
from sie.wire import codes
from sie.wire.ipc_batch import (
    DISPOSITION_PUBLISH_AND_ACK,
    DISPOSITION_PUBLISH_ERROR_AND_ACK,
    EncodeBatchItem,
    ItemOutcome,
    PreparedTokens,
    RunBatchItem,
    RunBatchRequest,
)
from sie.wire.ipc_control import EnsureModelReadyRequest, ModelControlStatusRequest
from sie.worker.manager import ModelManager
from sie.worker.runner import BatchRunner
from sie.worker.service import WorkerService

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = ["Hello world", "The weather is fine today", "Bye", "A fourth sentence about nothing", "Five"]
# Far past any vocabulary: [CLS] <id> [SEP] in BERT's numbering.
OUT_OF_VOCABULARY = [101, 10**9, 102]


@pytest.fixture()
async def client(baseline_catalog, load_model):
    directory = tempfile.mkdtemp(prefix="sie-ipc-", dir="/tmp")
    socket_path = Path(directory) / "worker.sock"
    async with ModelManager(baseline_catalog, lambda model, profile, model_id: load_model(model_id)) as manager:
        await manager.wait_ready(MINILM)
        service = WorkerService(manager, BatchRunner(manager), "worker-isolation", LaneSettings(), BatchingSettings())
        async with IpcServer(service, socket_path, worker_id="worker-isolation"), UdsWorkerClient(socket_path) as ipc:
            yield ipc
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture()
async def poison(client: UdsWorkerClient) -> PreparedTokens:
    """Prepared tokens under the worker's own tokenizer id (as its descriptor reports it), out of vocabulary."""
    ready = await client.ensure_model_ready(EnsureModelReadyRequest(model_id=MINILM))
    return PreparedTokens(input_ids=[OUT_OF_VOCABULARY], tokenizer_id=ready.descriptor.tokenizer_id)


def encode_batch(batch_id: int, texts: list[str], prepared: dict[int, PreparedTokens]) -> RunBatchRequest:
    """An encode RunBatch of `texts`; `prepared[index]` are the sidecar tokens of item `index`."""
    items = []
    for index, text in enumerate(texts):
        body = EncodeBatchItem(
            work_item_id=f"r{batch_id}.{index}", request_id=f"r{batch_id}", item_index=index,
            total_items=len(texts), timestamp=0.0, item={"text": text}, prepared_tokens=prepared.get(index),
        )  # fmt: skip
        items.append(RunBatchItem(op="encode", work_item_id=body.work_item_id, request_id=body.request_id,
                                  item_index=index, encode=body))  # fmt: skip
    return RunBatchRequest(model_id=MINILM, batch_id=batch_id, lora_key="", total_cost=len(texts), items=items)


def dense(outcome: ItemOutcome) -> np.ndarray:
    assert outcome.disposition == DISPOSITION_PUBLISH_AND_ACK, outcome.error
    return np.asarray(outcome.result_msgpack.value["dense"]["values"], dtype=np.float32)


def assert_failed_alone(outcome: ItemOutcome) -> None:
    """One error outcome, answered once (not redelivered), naming the model and the exception type only: none
    of onnxruntime's text (node names, the bad index, source locations)."""
    assert outcome.disposition == DISPOSITION_PUBLISH_ERROR_AND_ACK
    assert outcome.error_code == codes.QUEUE_INFERENCE_ERROR and outcome.nak_delay_ms == 0
    assert outcome.retry_after_s is None and outcome.result_msgpack is None
    assert outcome.error == (
        f"Model '{MINILM}' failed on this item (InvalidArgument); the worker log has the details"
    )  # fmt: skip


async def test_the_poison_item_fails_alone_and_its_batch_mates_get_what_they_get_alone(
    client: UdsWorkerClient, poison: PreparedTokens, caplog: pytest.LogCaptureFixture
) -> None:
    alone = []
    for index, text in enumerate(TEXTS):
        answer = await client.run_batch(encode_batch(100 + index, [text], {}))
        alone.append(dense(answer.outcomes[0]))
    with caplog.at_level(logging.WARNING, logger="sie.worker.runner"):
        outcome = await client.run_batch(encode_batch(1, TEXTS, {2: poison}))
    assert [item.work_item_id for item in outcome.outcomes] == [f"r1.{index}" for index in range(len(TEXTS))]
    assert_failed_alone(outcome.outcomes[2])
    for index in (0, 1, 3, 4):
        assert np.allclose(dense(outcome.outcomes[index]), alone[index], atol=1e-5)
    tracebacks = [record.getMessage() for record in caplog.records if record.exc_info]
    assert tracebacks == [f"item r1.2 of batch 1 of {MINILM} failed"]  # once, not once per bisection level


async def test_a_batch_where_every_item_fails_gives_every_item_its_own_error(
    client: UdsWorkerClient, poison: PreparedTokens
) -> None:
    outcome = await client.run_batch(encode_batch(2, TEXTS[:3], dict.fromkeys(range(3), poison)))
    assert [item.work_item_id for item in outcome.outcomes] == ["r2.0", "r2.1", "r2.2"]
    for item in outcome.outcomes:
        assert_failed_alone(item)
    (entry,) = (await client.model_control_status(ModelControlStatusRequest())).models
    assert (entry.batches, entry.items, entry.compute_seconds) == (0, 0, 0.0)  # no work succeeded


async def test_usage_counts_the_work_that_succeeded(client: UdsWorkerClient, poison: PreparedTokens) -> None:
    await client.run_batch(encode_batch(3, TEXTS, {0: poison}))
    (entry,) = (await client.model_control_status(ModelControlStatusRequest())).models
    assert (entry.batches, entry.items) == (1, len(TEXTS) - 1)
    assert entry.compute_seconds > 0 and entry.cost_per_item_s is not None and entry.cost_per_item_s > 0
