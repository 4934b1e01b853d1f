"""The shared scorer: sliced LM-head loss equals the plain full-logits loss."""

from __future__ import annotations

import pytest
import torch

from hallamonic.evaluation.scoring import is_out_of_memory, position_limit, run_guard, score_tokens


def test_sliced_scores_equal_full_logits(llama):
    ids = torch.randint(3, llama.config.vocab_size, (2, 50))
    with torch.no_grad():
        logp = llama(ids).logits.double().log_softmax(-1)  # (B, L, V)
    want = -logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, L-1)
    nll, hit = score_tokens(llama, ids, slice_len=7)
    assert nll.shape == hit.shape == (2, 49)
    torch.testing.assert_close(nll.double(), want, rtol=1e-4, atol=1e-4)
    assert torch.equal(hit, logp[:, :-1].argmax(-1) == ids[:, 1:])
    tail, _ = score_tokens(llama, ids, start=45, slice_len=3)
    torch.testing.assert_close(tail, nll[:, 45:])


def test_guards(llama):
    assert position_limit(llama) is None  # RoPE: may run past its window
    assert run_guard(llama, 10_000, None) is None
    assert "max-attention-length" in run_guard(llama, 10_000, 4096)
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_out_of_memory_is_caught_and_other_errors_propagate():
    from hallamonic.evaluation.scoring import unless_out_of_memory

    def oom():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    def bug():
        raise RuntimeError("shape mismatch")

    assert unless_out_of_memory(lambda: 3) == 3
    assert unless_out_of_memory(oom) is None
    with pytest.raises(RuntimeError, match="shape mismatch"):
        unless_out_of_memory(bug)
