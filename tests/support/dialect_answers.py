"""What the dialect and integration tests compare with: the inputs they send and the native routes' answers to them
(`/v1/encode` vectors, `/v1/score` scores) on the same server."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPLADE = "rasyosef/splade-tiny"
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France."]
QUERY = "Which city is France's capital?"
DOCS = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "Cats like warm places."]


def native_dense(url: str, texts: list[str], **params: Any) -> np.ndarray:
    body = {"items": [{"text": text} for text in texts], "params": {"output_types": ["dense"], **params}}
    answer = httpx.post(f"{url}/v1/encode/{MINILM}", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return np.asarray([item["dense"]["values"] for item in answer.json()["items"]], dtype=np.float32)


def native_scores(url: str) -> dict[int, float]:
    body = {"query": {"text": QUERY}, "items": [{"id": str(index), "text": doc} for index, doc in enumerate(DOCS)]}
    answer = httpx.post(f"{url}/v1/score/{MINILM}", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return {int(row["item_id"]): row["score"] for row in answer.json()["scores"]}
