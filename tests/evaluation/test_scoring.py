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


@pytest.mark.parametrize("seen", [False, True], ids=["ngram", "context-words"])
def test_sliced_scores_apply_the_copy_cache_like_the_forward(seen):
    """The scorer runs trunk and head itself: a Hallamonic copy cache must post-process each slice
    (with the context-word cue, each slice's counts include every token before it)."""
    from hallamonic.modeling import HallamonicConfig, HallamonicForCausalLM

    torch.manual_seed(0)
    config = HallamonicConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, copy_cache_orders=[1, 2], copy_cache_buckets=64,
        copy_cache_seen=seen,
    )
    model = HallamonicForCausalLM(config).eval()
    with torch.no_grad():
        model.copy_cache.gate.copy_(torch.tensor([[2.0, 0.1, -0.3, -1.0], [3.0, 0.0, 0.2, 0.0]]))
        if seen:
            model.copy_cache.seen_gate.copy_(torch.tensor([0.5, 0.2, 0.3, 0.8]))
    ids = torch.randint(0, 12, (2, 40))  # a small alphabet: many n-grams repeat
    with torch.no_grad():
        logp = model(ids).logits.double().log_softmax(-1)
        plain = model.lm_head(model.model(ids).last_hidden_state).double().log_softmax(-1)
    want = -logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    without = -plain[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    nll, _ = score_tokens(model, ids, slice_len=9)
    torch.testing.assert_close(nll.double(), want, rtol=1e-4, atol=1e-4)
    assert (nll.double() - without).abs().max() > 0.1  # the cache changed the scores
    if not seen:  # a checkpoint from before the context-word cue ships a head without it: forward(logits, predictions)
        head = model.copy_cache

        class HeadBeforeTheCue(torch.nn.Module):
            def forward(self, logits, predictions):
                return head(logits, predictions)

        model.copy_cache = HeadBeforeTheCue()
        torch.testing.assert_close(score_tokens(model, ids, slice_len=9)[0], nll)


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
