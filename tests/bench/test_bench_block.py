"""`hallamonic bench block`: the saved-activation count and the rows it compares."""

from __future__ import annotations

import torch

from hallamonic.bench.block import benchmark_blocks, format_table, saved_bytes


def test_saved_bytes_counts_each_saved_storage_once():
    a = torch.randn(100, requires_grad=True)
    b = torch.randn(100, requires_grad=True)
    _, product = saved_bytes(lambda: a * b)  # mul saves both operands
    _, square = saved_bytes(lambda: a * a)  # the same storage twice
    _, plain_sum = saved_bytes(lambda: (a + b).sum())  # add and sum save nothing
    assert (product, square, plain_sum) == (800, 400, 0)


def test_every_block_variant_gets_a_row_beside_attention():
    rows = benchmark_blocks(batch=1, length=16, hidden=32, heads=2, state_sizes=(1, 4), repeats=1)
    names = [r["mixer"] for r in rows]
    assert names == [
        "harmonic N=1", "harmonic N=4", "harmonic N=4 recompute", "harmonic N=4 hedgehog", "harmonic N=4 taylor M=4", "harmonic N=4 delta",
        "harmonic N=4 conv", "harmonic N=4 value path", "llama attention (sdpa)",
    ]
    by_name = {r["mixer"]: r for r in rows}
    assert by_name["harmonic N=4 recompute"]["saved_mb"] < by_name["harmonic N=4"]["saved_mb"]  # recompute keeps less
    assert all(r["saved_mb"] > 0 and r["ms"] > 0 for r in rows)
    assert "harmonic N=4 delta" in format_table(rows)
