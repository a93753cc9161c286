"""The standard BERT-style feed dict of a padded batch."""

from __future__ import annotations

import numpy as np

from sie.tokenization import PaddedBatch


def bert_feeds(batch: PaddedBatch) -> dict[str, np.ndarray]:
    return {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "token_type_ids": batch.token_type_ids,
    }
