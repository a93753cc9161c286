"""What the batch runner measures per model: counts, device-seconds and an average cost per item."""

from __future__ import annotations

import pytest

from sie.worker.runner import COST_EMA_WEIGHT, ModelUsage


def test_the_first_batch_sets_the_cost_and_later_ones_move_it_by_the_ema_weight() -> None:
    usage = ModelUsage()
    assert usage.cost_per_item_s is None
    usage.record(items=4, seconds=0.4)
    assert usage.cost_per_item_s == pytest.approx(0.1)
    usage.record(items=2, seconds=0.6)
    assert usage.cost_per_item_s == pytest.approx(0.1 + COST_EMA_WEIGHT * (0.3 - 0.1))
    assert (usage.batches, usage.items) == (2, 6)
    assert usage.compute_seconds == pytest.approx(1.0)


def test_an_empty_batch_counts_as_one_item() -> None:
    usage = ModelUsage()
    usage.record(items=0, seconds=0.2)
    assert usage.cost_per_item_s == pytest.approx(0.2)
