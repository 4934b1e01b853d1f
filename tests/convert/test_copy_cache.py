"""The copy cache's fit: its loss equals the cached model's own, the fit opens the gate where
copying pays, and a model with a fitted cache saves and reloads with the same logits."""

from __future__ import annotations

import pytest
import torch

from hallamonic.convert.copy_cache import attach_copy_cache, cached_nll, copy_cache_statistics, fit_copy_cache
from hallamonic.modeling import HallamonicConfig, HallamonicForCausalLM


def tiny_model(seed: int = 0) -> HallamonicForCausalLM:
    torch.manual_seed(seed)
    config = HallamonicConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, state_size=8,
    )
    return HallamonicForCausalLM(config).eval()


def repeating_windows(count: int, length: int, seed: int = 0) -> torch.Tensor:
    """Windows that repeat a random 12-token phrase: the next token is often what followed last time."""
    gen = torch.Generator().manual_seed(seed)
    windows = []
    for _ in range(count):
        phrase = torch.randint(0, 40, (12,), generator=gen)
        noise = torch.randint(0, 40, (length,), generator=gen)
        row = torch.cat([phrase if i % 2 == 0 else noise[:12] for i in range(length // 12 + 1)])[:length]
        windows.append(row)
    return torch.stack(windows)  # (W, L)


def test_the_fit_loss_is_the_cached_models_own_loss():
    model = tiny_model()
    attach_copy_cache(model, [2, 4, 1], 64)  # not sorted: "longer" is by order, not by position in the list
    with torch.no_grad():
        model.copy_cache.gate.copy_(torch.tensor([[0.5, 0.3, -0.4, -1.5], [1.5, -0.1, 0.0, 0.7], [2.0, 0.2, 0.3, -2.0]]))
    windows = repeating_windows(3, 50)
    stats = copy_cache_statistics(model, windows, progress=False)
    assert stats["overruled"].any() and not stats["overruled"].all()  # the term is exercised
    with torch.no_grad():
        logits = model(windows).logits.double()  # the forward applies the cache
        want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 40), windows[:, 1:].reshape(-1))
        assert abs(float(cached_nll(stats, model.copy_cache)) - float(want)) < 1e-5


def test_fit_opens_the_gate_where_copying_pays_and_lowers_the_loss():
    model = tiny_model()
    attach_copy_cache(model, [1, 2, 3], 256)
    report = fit_copy_cache(model, repeating_windows(6, 96), steps=150, progress=False)
    assert report["nll_after"] < report["nll_before"] - 0.3
    assert report["orders"] == [1, 2, 3] and report["fit_tokens"] == 6 * 95
    torch.testing.assert_close(model.copy_cache.gate, torch.tensor(report["gate"]), atol=1e-3, rtol=0)  # written into the model
    fresh = repeating_windows(2, 96, seed=1)  # held out: the fitted cache helps there too
    with torch.no_grad():
        cached = torch.nn.functional.cross_entropy(model(fresh).logits[:, :-1].reshape(-1, 40), fresh[:, 1:].reshape(-1))
        plain_logits = model.lm_head(model.model(fresh).last_hidden_state)
        plain = torch.nn.functional.cross_entropy(plain_logits[:, :-1].reshape(-1, 40), fresh[:, 1:].reshape(-1))
    assert cached < plain - 0.3
    model.copy_cache = None  # how a user turns it off (e.g. for open-ended generation)
    with torch.no_grad():
        torch.testing.assert_close(model(fresh).logits, plain_logits)


def test_a_fitted_cache_saves_and_reloads_with_the_same_logits(tmp_path):
    model = tiny_model()
    attach_copy_cache(model, [1, 2], 128)
    fit_copy_cache(model, repeating_windows(2, 48), steps=20, progress=False)
    model.save_pretrained(tmp_path)
    again = HallamonicForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.copy_cache_orders == [1, 2] and again.config.copy_cache_buckets == 128
    ids = repeating_windows(1, 40, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits)


def test_bad_orders_and_missing_ids_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="copy_cache_orders"):
        attach_copy_cache(model, [2, 2], 64)
    with pytest.raises(ValueError, match="no copy cache"):
        fit_copy_cache(tiny_model(), repeating_windows(1, 24), progress=False)
    attach_copy_cache(model, [1], 64)
    with pytest.raises(ValueError, match="pass `input_ids`"):
        model(inputs_embeds=torch.zeros(1, 5, 32))
