"""An exact-match n-gram copy cache: for each order n, the token that followed the most recent
earlier occurrence of the last n tokens.

Why: the converted blocks do not copy (a span repeated verbatim is predicted no better the second
time), because a decayed linear-attention state cannot make the sharp, position-aware match a
softmax copy head makes. An induction rule over token ids can, at any distance, in constant
memory: per order a hash table of ``buckets`` entries, n-gram -> (its hash, the token after it).
A gate on top (in the model) decides how much each order's token is raised; this file only finds
the tokens.

Semantics, identical in every implementation so that a prefill in any chunks plus single steps
equals one pass over the whole sequence: the n-gram ending at position j is inserted into bucket
``hash mod buckets`` once the token j+1 is known (overwriting the bucket); the prediction at t is
the bucket's token if the bucket's hash equals the hash of the n-gram ending at t, else -1.
Collisions therefore only forget; they never predict a token that did not follow the same
n-gram (up to a 62-bit hash match). Negative token ids (padding) never form n-grams.

* :func:`reference_copy_predictions` -- the plain loop over positions, the ground truth in tests.
* :func:`copy_predictions` -- vectorised over a chunk: sort the chunk's positions by bucket, find
  each lookup's latest earlier insertion in the chunk, fall back to the carried table, then write
  the chunk's last insertion per bucket into the table.
* :func:`context_counts` / :func:`advance_counts` -- the optional context-word cue's state: how many
  times each vocabulary entry has occurred so far (one (B, V) count table, constant in length).

This file is shipped inside every converted checkpoint: it imports only torch and the standard
library, and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_PRIMES = (2_147_483_629, 2_147_483_587)  # two primes < 2^31: h * base stays inside int64
_BASES = (1_000_003, 999_983)
_LOW_BITS = 31  # hash = h1 << 31 | h2: 62 bits


@dataclass
class CopyCacheState:
    """What the cache carries between chunks: the last ``max(orders)`` tokens and one table per order."""

    tail: torch.Tensor  # (B, R) int64: the last R tokens, -1 where none
    keys: torch.Tensor  # (B, K, M) int64: each bucket's n-gram hash, -1 = empty
    successors: torch.Tensor  # (B, K, M) int64: the token that followed it

    @classmethod
    def empty(cls, batch: int, orders: list[int], buckets: int, device: torch.device | None = None) -> "CopyCacheState":
        shape = (batch, len(orders), buckets)
        return cls(
            tail=torch.full((batch, max(orders)), -1, dtype=torch.long, device=device),
            keys=torch.full(shape, -1, dtype=torch.long, device=device),
            successors=torch.full(shape, -1, dtype=torch.long, device=device),
        )

    def select(self, index: torch.Tensor) -> "CopyCacheState":
        """The rows in `index` (beam search reorders the batch)."""
        return CopyCacheState(self.tail[index], self.keys[index], self.successors[index])


def ngram_hashes(tokens: torch.Tensor, n: int) -> torch.Tensor:
    """(B, L) int64: a 62-bit hash of tokens[.., t-n+1 .. t], or -1 where the n-gram does not
    exist (t < n-1) or holds a negative id."""
    length = tokens.shape[1]
    h1 = torch.zeros_like(tokens)
    h2 = torch.zeros_like(tokens)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    for back in range(n):  # the token `back` steps before t
        shifted = torch.nn.functional.pad(tokens, (back, 0), value=-1)[:, :length]  # (B, L)
        valid &= shifted >= 0
        h1 = (h1 * _BASES[0] + shifted + 1) % _PRIMES[0]
        h2 = (h2 * _BASES[1] + shifted + 1) % _PRIMES[1]
    return torch.where(valid, (h1 << _LOW_BITS) | h2, -1)


def reference_copy_predictions(
    tokens: torch.Tensor, orders: list[int], buckets: int, state: CopyCacheState | None = None
) -> tuple[torch.Tensor, CopyCacheState]:
    """The loop: for each t, insert the n-gram ending at t-1 (its successor, tokens[t], is now
    known), then look up the n-gram ending at t. tokens: (B, L); returns (B, L, K) and the state."""
    batch, length = tokens.shape
    state = state or CopyCacheState.empty(batch, orders, buckets, tokens.device)
    tail, keys, successors = state.tail.clone(), state.keys.clone(), state.successors.clone()
    preds = torch.full((batch, length, len(orders)), -1, dtype=torch.long, device=tokens.device)
    history = torch.cat([tail, tokens], dim=1)  # (B, R + L)
    width = tail.shape[1]
    for k, n in enumerate(orders):
        hashes = ngram_hashes(history, n)  # (B, R + L)
        for row in range(batch):
            for e in range(width, width + length):  # e: position in history of the token at t
                j = e - 1  # the n-gram ending before t gets its successor
                if hashes[row, j] >= 0 and history[row, e] >= 0:
                    bucket = int(hashes[row, j] % buckets)
                    keys[row, k, bucket], successors[row, k, bucket] = hashes[row, j], history[row, e]
                if hashes[row, e] >= 0:
                    bucket = int(hashes[row, e] % buckets)
                    if keys[row, k, bucket] == hashes[row, e]:
                        preds[row, e - width, k] = successors[row, k, bucket]
    return preds, CopyCacheState(history[:, -width:], keys, successors)


def copy_predictions(
    tokens: torch.Tensor, orders: list[int], buckets: int, state: CopyCacheState | None = None
) -> tuple[torch.Tensor, CopyCacheState]:
    """Vectorised :func:`reference_copy_predictions`: the same (B, L, K) predictions and state."""
    batch, length = tokens.shape
    state = state or CopyCacheState.empty(batch, orders, buckets, tokens.device)
    width = state.tail.shape[1]
    history = torch.cat([state.tail, tokens], dim=1)  # (B, R + L)
    rows = torch.arange(batch, device=tokens.device)[:, None]  # (B, 1): keeps rows apart in one sort
    span = length + 1  # positions e = R-1 .. R+L-1: the last tail n-gram plus the chunk's
    positions = torch.arange(width - 1, width + length, device=tokens.device)  # (S,)
    next_token = history[:, positions[:-1] + 1]  # (B, L): successors of positions R-1 .. R+L-2
    successor = torch.nn.functional.pad(next_token, (0, 1), value=-1)  # (B, S): none yet for the last
    preds = torch.full((batch, length, len(orders)), -1, dtype=torch.long, device=tokens.device)
    keys, successors = state.keys.clone(), state.successors.clone()
    for k, n in enumerate(orders):
        hashes = ngram_hashes(history, n)[:, positions]  # (B, S)
        inserts = torch.zeros_like(hashes, dtype=torch.bool)
        inserts[:, :-1] = (hashes[:, :-1] >= 0) & (next_token >= 0)  # the last position has no successor yet
        bucket = torch.where(hashes >= 0, hashes % buckets, buckets + torch.arange(span, device=tokens.device))
        # Sort each row's positions by bucket (stable: position order within a bucket), rows apart.
        order = torch.argsort(rows * (buckets + span) + bucket, dim=1, stable=True)  # (B, S)
        sorted_bucket = bucket.gather(1, order)
        index = torch.arange(span, device=tokens.device).expand(batch, span)
        group_start = torch.ones_like(sorted_bucket, dtype=torch.bool)
        group_start[:, 1:] = sorted_bucket[:, 1:] != sorted_bucket[:, :-1]
        first_in_group = torch.cummax(torch.where(group_start, index, 0), dim=1).values  # (B, S)
        insert_index = torch.where(inserts.gather(1, order), index, -1)
        latest = torch.cummax(insert_index, dim=1).values  # latest insertion at or before each sorted slot
        earlier = torch.full_like(latest, -1)
        earlier[:, 1:] = latest[:, :-1]  # strictly before
        found = earlier >= first_in_group  # an insertion earlier in the same bucket, inside this chunk
        source = order.gather(1, earlier.clamp(min=0))  # (B, S) position (in span) of that insertion
        sorted_hash = hashes.gather(1, order)
        in_chunk = torch.where(sorted_hash == hashes.gather(1, source), successor.gather(1, source), -1)
        table_bucket = torch.where(sorted_hash >= 0, sorted_hash % buckets, 0)
        from_table = torch.where(
            keys[:, k].gather(1, table_bucket) == sorted_hash, successors[:, k].gather(1, table_bucket), -1
        )
        sorted_pred = torch.where(sorted_hash < 0, -1, torch.where(found, in_chunk, from_table))
        pred = torch.empty_like(sorted_pred).scatter_(1, order, sorted_pred)  # back to position order
        preds[:, :, k] = pred[:, 1:]  # span slot 0 is the tail's last position: no lookup there
        # The table keeps, per bucket, the chunk's last insertion.
        last = torch.full((batch, buckets), -1, dtype=torch.long, device=tokens.device)
        slot = torch.where(inserts, index, -1)
        last.scatter_reduce_(1, torch.where(inserts, bucket, 0), slot, reduce="amax")
        touched = last >= 0
        winner = last.clamp(min=0)
        keys[:, k] = torch.where(touched, hashes.gather(1, winner), keys[:, k])
        successors[:, k] = torch.where(touched, successor.gather(1, winner), successors[:, k])
    return preds, CopyCacheState(history[:, -width:], keys, successors)


def context_counts(
    tokens: torch.Tensor, vocab: int, start: int = 0, stop: int | None = None, carried: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, stop - start, V) float32: how many times each token id occurred in the sequence up to and
    including position t, for t = start .. stop-1 of tokens (B, L); ``carried`` (B, V) counts what
    came before this chunk. Negative ids (padding) are not counted. What the context-word cue reads
    (``copy_cache_seen``): as large as the logits of the same positions, and no larger."""
    batch, length = tokens.shape
    stop = length if stop is None else stop
    ids, real = tokens.clamp(min=0), (tokens >= 0).float()  # (B, L) each
    before = torch.zeros(batch, vocab, device=tokens.device) if carried is None else carried.float().clone()
    before.scatter_add_(1, ids[:, :start], real[:, :start])  # (B, V): everything before `start`
    steps = torch.zeros(batch, stop - start, vocab, device=tokens.device)
    steps.scatter_(2, ids[:, start:stop, None], real[:, start:stop, None])  # (B, S, V): one-hot of each position
    return before[:, None, :] + steps.cumsum(1)


def advance_counts(counts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, V) int64 counts after the chunk tokens (B, L) (negative ids not counted)."""
    return counts.scatter_add(1, tokens.clamp(min=0), (tokens >= 0).long())
