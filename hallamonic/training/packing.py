"""A token stream cut into fixed-length sequences, served as deterministic batches.

The batch of optimizer step s is a pure function of (seed, s): an interrupted run resumes on
exactly the batches it would have seen, and runs that share a seed see the same sequences in the
same order (the study's equal-budget protocol relies on it).
"""

from __future__ import annotations

import numpy as np
import torch

from hallamonic.data import DataError


class PackedBatches:
    """Fixed-length sequences cut from a token stream, served as deterministic batches."""

    def __init__(self, tokens: np.ndarray, seq_len: int, *, seed: int, source: str = "the training data"):
        n_sequences = len(tokens) // seq_len
        if n_sequences == 0:
            raise DataError(
                f"{source} has {len(tokens)} tokens, fewer than one sequence of {seq_len}; "
                "add data or lower the phase's seq_len"
            )
        self.sequences = torch.from_numpy(tokens[: n_sequences * seq_len].astype(np.int64)).view(n_sequences, seq_len)
        self.seed = seed
        self._orders: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.sequences.shape[0]

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders[epoch] = torch.randperm(len(self), generator=generator)
        return self._orders[epoch]

    def batch(self, step: int, micro: int, batch_size: int, grad_accum: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """Sequences (batch_size, seq_len) for one micro-batch of one process at optimizer step ``step``.

        The global batch of a step holds batch_size * grad_accum * world sequences; epoch e visits
        the sequences in the order of a permutation seeded by (seed, e).
        """
        per_step = batch_size * grad_accum * world
        first = step * per_step + (micro * world + rank) * batch_size
        rows = []
        for g in range(first, first + batch_size):
            epoch, offset = divmod(g, len(self))
            rows.append(self._order(epoch)[offset])
        return self.sequences[torch.stack(rows)]
