"""Packing: fixed-length sequences served as deterministic batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hallamonic.data import DataError
from hallamonic.training.packing import PackedBatches


def test_batches_are_deterministic_and_cover_an_epoch():
    tokens = np.arange(10 * 8, dtype=np.int32)
    batches = PackedBatches(tokens, 8, seed=3)
    seen = torch.cat([batches.batch(step, 0, 2, 1) for step in range(5)])  # 5 steps x 2 = one epoch
    assert sorted(seen[:, 0].tolist()) == list(range(0, 80, 8))
    again = PackedBatches(tokens, 8, seed=3)
    assert torch.equal(batches.batch(7, 0, 2, 1), again.batch(7, 0, 2, 1))
    # two processes split a step's rows without overlap
    rank0, rank1 = batches.batch(0, 0, 2, 1, rank=0, world=2), batches.batch(0, 0, 2, 1, rank=1, world=2)
    assert not set(rank0[:, 0].tolist()) & set(rank1[:, 0].tolist())


def test_too_little_data_is_a_clear_error():
    with pytest.raises(DataError, match="fewer than one sequence of 64"):
        PackedBatches(np.arange(10, dtype=np.int32), 64, seed=0)
