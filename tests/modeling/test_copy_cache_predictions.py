"""The copy cache's n-gram recall: the vectorised chunk path against the plain loop, and both
against the plain definition (the last earlier occurrence of the current n-gram)."""

from __future__ import annotations

import random

import pytest
import torch

from hallamonic.modeling.hallamonic_copy_cache import (
    CopyCacheState, advance_counts, context_counts, copy_predictions, ngram_hashes, reference_copy_predictions,
)


def last_match_successors(seq: list[int], n: int) -> list[int]:
    """The definition, by brute force: what followed the latest earlier occurrence of seq[t-n+1..t]."""
    out = []
    for t in range(len(seq)):
        found = -1
        gram = seq[t - n + 1 : t + 1] if t >= n - 1 else None
        if gram is not None and min(gram) >= 0:
            for j in range(t - 1, n - 2, -1):
                if seq[j - n + 1 : j + 1] == gram:
                    found = seq[j + 1]
                    break
        out.append(found)
    return out


def random_tokens(batch: int, length: int, vocab: int, seed: int, left_pad: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, length), generator=gen)
    if left_pad:
        for row in range(batch):
            tokens[row, : (row * 3) % max(length, 1)] = -1
    return tokens


@pytest.mark.parametrize("orders", [[1], [1, 2, 3], [2, 5]])
@pytest.mark.parametrize("vocab", [3, 40])
def test_predictions_follow_the_definition_without_collisions(orders, vocab):
    tokens = random_tokens(3, 61, vocab, seed=vocab)
    preds, _ = copy_predictions(tokens, orders, buckets=1 << 20)
    for row in range(3):
        for k, n in enumerate(orders):
            assert preds[row, :, k].tolist() == last_match_successors(tokens[row].tolist(), n)


@pytest.mark.parametrize("buckets", [1, 2, 7, 1 << 16])
@pytest.mark.parametrize("left_pad", [False, True])
@pytest.mark.parametrize("length", [1, 2, 9, 50])
def test_vectorised_path_equals_the_loop_in_predictions_and_state(buckets, left_pad, length):
    """Collisions (few buckets) forget older n-grams in both paths alike; padding forms no n-grams."""
    orders = [1, 2, 4]
    tokens = random_tokens(2, length, 5, seed=length + buckets, left_pad=left_pad)
    ref_preds, ref_state = reference_copy_predictions(tokens, orders, buckets)
    preds, state = copy_predictions(tokens, orders, buckets)
    assert torch.equal(preds, ref_preds)
    for got, want in ((state.tail, ref_state.tail), (state.keys, ref_state.keys), (state.successors, ref_state.successors)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("buckets", [3, 1 << 16])
def test_any_chunking_equals_one_pass(buckets):
    """Prefill in chunks of any size, single steps included, gives the one-pass predictions."""
    orders = [1, 3, 6]
    tokens = random_tokens(2, 80, 6, seed=buckets)
    whole, _ = reference_copy_predictions(tokens, orders, buckets)
    rng = random.Random(buckets)
    for _ in range(4):
        state, parts, start = None, [], 0
        while start < tokens.shape[1]:
            size = rng.choice([1, 1, 2, 5, 13])
            part, state = copy_predictions(tokens[:, start : start + size], orders, buckets, state)
            parts.append(part)
            start += size
        assert torch.equal(torch.cat(parts, dim=1), whole)


def test_a_repeated_span_is_predicted_from_its_second_token_on():
    span = [11, 12, 13, 14, 15, 16]
    tokens = torch.tensor([[7, 8] + span + [9, 10] + span])
    preds, _ = copy_predictions(tokens, [1, 2, 3], buckets=1 << 16)
    second = len(tokens[0]) - len(span)
    for t in range(second, len(tokens[0]) - 1):  # every order that fits predicts the next span token
        expected = tokens[0, t + 1].item()
        for k, n in enumerate([1, 2, 3]):
            if t - second + 1 >= n:
                assert preds[0, t, k].item() == expected


def test_hashes_mark_ngrams_that_reach_padding_or_the_start_as_missing():
    tokens = torch.tensor([[-1, 4, 5, 6]])
    assert ngram_hashes(tokens, 2)[0].tolist()[:2] == [-1, -1]
    assert (ngram_hashes(tokens, 2)[0, 2:] >= 0).all()
    assert ngram_hashes(tokens, 5)[0].eq(-1).all()


def test_state_rows_follow_a_beam_reorder():
    tokens = random_tokens(3, 20, 4, seed=1)
    _, state = copy_predictions(tokens, [1, 2], 16)
    picked = state.select(torch.tensor([2, 2, 0]))
    assert torch.equal(picked.keys[0], state.keys[2]) and torch.equal(picked.tail[2], state.tail[0])
    empty = CopyCacheState.empty(2, [1, 2], 16)
    assert empty.keys.shape == (2, 2, 16) and empty.tail.shape == (2, 2) and empty.keys.eq(-1).all()


def test_an_order_is_overruled_when_a_longer_order_predicts_another_token():
    """The head's backoff cue: by n-gram order, not by the orders' place in the list."""
    from hallamonic.modeling.modeling_hallamonic import CopyCacheHead

    head = CopyCacheHead([4, 1, 2])  # columns: order 4, order 1, order 2
    predictions = torch.tensor([
        [7, 5, 7],    # order 1 says 5, orders 2 and 4 say 7: only order 1 overruled
        [-1, 5, 6],   # order 2 says 6 against order 1's 5: order 1 overruled; order 4 matched nothing
        [7, 7, -1],   # agreement: none
        [-1, 5, -1],  # a lone order: none
        [3, -1, 6],   # order 2 overruled by order 4; order 1 has no prediction, so it is not
    ])
    want = torch.tensor([
        [False, True, False],
        [False, True, False],
        [False, False, False],
        [False, False, False],
        [False, False, True],
    ])
    assert torch.equal(head.overruled(predictions), want)
    assert torch.equal(head.overruled(predictions[None]), want[None])  # any leading shape


@pytest.mark.parametrize("start, stop", [(0, None), (5, 17), (16, 17), (0, 1)])
def test_context_counts_count_each_id_so_far_with_carried_counts_and_padding(start, stop):
    """The context-word cue's input: per position, how often each id occurred up to and including
    it, continuing from carried counts; padding (-1) is never counted."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 7, (2, 17), generator=gen)
    tokens[1, :4] = -1  # left padding
    carried = torch.randint(0, 3, (2, 7), generator=gen)
    got = context_counts(tokens, 7, start, stop, carried)
    stop = 17 if stop is None else stop
    assert got.shape == (2, stop - start, 7)
    for b in range(2):
        for t in range(start, stop):
            want = carried[b].clone()
            for s in tokens[b, : t + 1].tolist():
                if s >= 0:
                    want[s] += 1
            assert torch.equal(got[b, t - start].long(), want)
    assert torch.equal(advance_counts(carried, tokens), context_counts(tokens, 7, 16, 17, carried)[:, 0].long())
