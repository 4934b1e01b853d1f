"""The copy cache's fit: its loss equals the cached model's own, the fit opens the gate where
copying pays, and a model with a fitted cache saves and reloads with the same logits."""

from __future__ import annotations

import pytest
import torch

from hallamonic.convert.copy_cache import (
    attach_copy_cache,
    cached_nll,
    copy_cache_statistics,
    fast_seen_cached_nll,
    fit_copy_cache,
    seen_cached_nll,
    slot_terms,
    unigram_log_prior,
    window_slots,
    word_continuation_table,
)
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


def test_the_context_word_fit_loss_is_the_cached_models_own_loss():
    """With the context-word cue the fit reads only the windows' own tokens (slots) and the
    log-sum-exp of the rest: still exactly the loss of the model's own logits."""
    model = tiny_model()
    attach_copy_cache(model, [1, 3], 64, seen=True)
    with torch.no_grad():
        model.copy_cache.gate.copy_(torch.tensor([[0.5, 0.3, -0.4, -1.5], [1.5, -0.1, 0.2, 0.0]]))
        model.copy_cache.seen_gate.copy_(torch.tensor([0.3, 0.2, 0.4, 0.6]))
    windows = torch.cat([repeating_windows(2, 50), torch.randint(0, 25, (1, 50))])  # windows with different slot counts
    stats = copy_cache_statistics(model, windows, progress=False)
    with torch.no_grad():
        logits = model(windows).logits.double()
        want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 40), windows[:, 1:].reshape(-1))
        assert abs(float(seen_cached_nll(stats, model.copy_cache)) - float(want)) < 1e-5
        model.copy_cache.seen_gate.fill_(-30.0)  # closed: back to the n-gram cache alone
        assert abs(float(seen_cached_nll(stats, model.copy_cache)) - float(cached_nll(stats, model.copy_cache))) < 1e-5


def test_the_context_word_fit_beats_the_ngram_fit_on_text_that_reuses_its_words():
    """Windows whose words come from a small per-window set, in no fixed order: no n-gram leads to
    the next word, but it is one seen before. The cue's fit must find that (and report both)."""
    gen = torch.Generator().manual_seed(0)
    windows = torch.stack([torch.randperm(40, generator=gen)[:6][torch.randint(0, 6, (96,), generator=gen)] for _ in range(6)])
    ngram_model, seen_model = tiny_model(), tiny_model()
    attach_copy_cache(ngram_model, [1, 2], 256)
    attach_copy_cache(seen_model, [1, 2], 256, seen=True)
    ngram = fit_copy_cache(ngram_model, windows, steps=150, progress=False)
    seen = fit_copy_cache(seen_model, windows, steps=150, progress=False)
    assert seen["nll_ngram_only"] == pytest.approx(ngram["nll_after"], abs=1e-4)  # the same first stage
    assert seen["nll_after"] < ngram["nll_after"] - 0.3
    torch.testing.assert_close(seen_model.copy_cache.seen_gate, torch.tensor(seen["seen_gate"]), atol=1e-3, rtol=0)
    with torch.no_grad():  # the fitted numbers are the model's: its own loss is the reported one
        logits = seen_model(windows).logits
        own = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 40), windows[:, 1:].reshape(-1))
    assert float(own) == pytest.approx(seen["nll_after"], abs=1e-3)


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


ODD_CONTINUES = torch.arange(40) % 2 == 1  # a made-up vocabulary: odd ids continue a word


def test_the_continuation_term_raises_only_tokens_that_continue_a_word_and_the_fit_loss_stays_exact():
    """The fifth gate column adds w_n where the copied token continues a word (the table's ids),
    nothing elsewhere; the fit's loss (both stages) is still the cached model's own loss."""
    model = tiny_model()
    attach_copy_cache(model, [1, 3], 64, seen=True, continues_word=ODD_CONTINUES)
    gate = torch.tensor([[0.5, 0.3, -0.4, -1.5, 0.0], [1.5, -0.1, 0.2, 0.0, 0.0]])
    windows = torch.cat([repeating_windows(2, 50), torch.randint(0, 25, (1, 50))])
    with torch.no_grad():
        model.copy_cache.gate.copy_(gate)
        model.copy_cache.seen_gate.copy_(torch.tensor([0.3, 0.2, 0.4, 0.6]))
        before = model(windows).logits
        model.copy_cache.gate[:, 4] = 2.0
        after = model(windows).logits
    preds = model.copy_cache_predictions(windows)  # (W, L, K)
    raised = ((preds >= 0) & ODD_CONTINUES[preds.clamp(min=0)]).any(-1)  # (W, L): some order copies an odd id
    changed = (after - before).abs().amax(-1) > 1e-6
    assert raised.any() and (~raised).any() and torch.equal(changed, raised)
    stats = copy_cache_statistics(model, windows, progress=False)
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(after[:, :-1].double().reshape(-1, 40), windows[:, 1:].reshape(-1))
        assert abs(float(seen_cached_nll(stats, model.copy_cache)) - float(want)) < 1e-5
        model.copy_cache.seen_gate.fill_(-30.0)
        ngram = torch.nn.functional.cross_entropy(model(windows).logits[:, :-1].double().reshape(-1, 40), windows[:, 1:].reshape(-1))
        assert abs(float(cached_nll(stats, model.copy_cache)) - float(ngram)) < 1e-5


def test_the_continuation_fit_trusts_copies_that_continue_a_word():
    """Windows where a word-continuing id always follows the same id (a name spelled the same each
    time) and other ids are followed by noise: the fit gives the continuation term a positive w and
    beats the fit without it."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(6):
        row = []
        for _ in range(40):
            start = int(torch.randint(0, 20, (1,), generator=gen)) * 2  # an even id: a word's first piece
            row += [start, start + 1] if start < 10 else [start, int(torch.randint(0, 20, (1,), generator=gen)) * 2]
        rows.append(torch.tensor(row))
    windows = torch.stack(rows)  # (6, 80)
    plain, cont = tiny_model(), tiny_model()
    attach_copy_cache(plain, [1], 64)
    attach_copy_cache(cont, [1], 64, continues_word=ODD_CONTINUES)
    without = fit_copy_cache(plain, windows, steps=200, progress=False)
    with_term = fit_copy_cache(cont, windows, steps=200, progress=False)
    assert with_term["gate"][0][4] > 1.0 and len(without["gate"][0]) == 4
    assert with_term["nll_after"] < without["nll_after"] - 0.05


def test_the_word_continuation_table_reads_the_tokenizer():
    """Pieces that continue a word (no space, a letter first) and the rest (digits too), for a byte-level
    BPE tokenizer (GPT-2 style, as SmolLM2's) built here from a tiny vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {"a": 0, "Ġthe": 1, "ou": 2, "ĠKar": 3, ".": 4, "7": 5, "Ġ": 6, "ell": 7, "Ċ": 8, "'s": 9}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    table = word_continuation_table(tokenizer, 12)
    assert table.tolist() == [True, False, True, False, False, False, False, True, False, False, False, False]


RAMP_PRIOR = -(torch.arange(40, dtype=torch.float32) + 1) / 4  # a made-up prior: higher ids rarer


def change_one_cue_number(model, gate: list, seen_gate: list, index: int, value: float):
    """(windows, logits after, counts (W, L, V), logits after - before): the cached model on windows
    with repeats and without, before and after its cue's number `index` is set to `value`."""
    windows = torch.cat([repeating_windows(2, 50), torch.randint(0, 25, (1, 50))])
    with torch.no_grad():
        model.copy_cache.gate.copy_(torch.tensor(gate))
        model.copy_cache.seen_gate.copy_(torch.tensor(seen_gate))
        before = model(windows).logits
        model.copy_cache.seen_gate[index] = value
        after = model(windows).logits
    return windows, after, model.copy_cache_counts(windows), after - before


def test_the_prior_term_raises_context_tokens_by_their_prior_and_the_fit_loss_stays_exact():
    """The cue's fifth number adds h log prior(v) inside the softplus of every seen token, unseen ones
    untouched; the fit's slot statistics carry each slot's prior, so its loss is still exactly the
    cached model's own."""
    model = tiny_model()
    attach_copy_cache(model, [1, 3], 64, seen=True, continues_word=ODD_CONTINUES, log_prior=RAMP_PRIOR)
    gate = [[0.5, 0.3, -0.4, -1.5, 0.4], [1.5, -0.1, 0.2, 0.0, -0.3]]
    windows, after, counts, delta = change_one_cue_number(model, gate, [0.3, 0.2, 0.4, 0.6, 0.0], 4, -0.5)
    assert torch.all(delta[counts == 0] == 0)  # tokens not yet seen: no change
    seen_delta = delta[0, -1][counts[0, -1] > 0]  # the last position of a window: its seen tokens, ids ascending
    assert len(seen_delta) > 3 and torch.all(seen_delta > 0)  # rarer tokens raised more ...
    ids = counts[0, -1].nonzero()[:, 0]
    order = torch.argsort(ids)
    assert float(torch.corrcoef(torch.stack([ids[order].float(), seen_delta[order]]))[0, 1]) > 0.5  # ... rising with the id
    stats = copy_cache_statistics(model, windows, progress=False)
    assert stats["slot_prior"].shape == stats["slot_count"].shape
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(after[:, :-1].double().reshape(-1, 40), windows[:, 1:].reshape(-1))
        assert abs(float(seen_cached_nll(stats, model.copy_cache)) - float(want)) < 1e-5


def test_the_prior_fit_raises_rare_words_more_than_common_ones():
    """Windows where rare ids (the top of the vocabulary) come back and common ones are drawn at
    random: the fit gives the prior term a negative h (rarer, raised more) and beats the fit without it."""
    gen = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(6):
        names = torch.randint(30, 40, (3,), generator=gen)  # a window's few names, repeated
        row = [int(names[torch.randint(0, 3, (1,), generator=gen)]) if i % 4 == 3 else int(torch.randint(0, 30, (1,), generator=gen))
               for i in range(96)]
        rows.append(torch.tensor(row))
    windows = torch.stack(rows)  # (6, 96)
    prior = torch.where(torch.arange(40) >= 30, -8.0, -3.0)  # rare names, common rest
    plain, with_prior = tiny_model(), tiny_model()
    attach_copy_cache(plain, [1], 64, seen=True)
    attach_copy_cache(with_prior, [1], 64, seen=True, log_prior=prior)
    without = fit_copy_cache(plain, windows, steps=100, progress=False)
    fitted = fit_copy_cache(with_prior, windows, steps=100, progress=False)
    assert len(without["seen_gate"]) == 4 and fitted["seen_gate"][4] < -0.1
    assert fitted["nll_after"] < without["nll_after"] - 0.02


def test_the_rate_term_weakens_the_cue_along_the_window_and_the_fit_loss_stays_exact():
    """The cue's last number adds q log t (t = tokens so far) inside the softplus of every seen
    token, the same at one position for all of them; the fit reads t from the slot counts, so its
    loss is still exactly the cached model's own, with the prior beside it."""
    model = tiny_model()
    attach_copy_cache(model, [1, 3], 64, seen=True, log_prior=RAMP_PRIOR, rate=True, count_cap=3)  # the cap's loss too
    assert model.config.copy_cache_rate and model.copy_cache.seen_gate.shape == (6,)
    gate = [[0.5, 0.3, -0.4, -1.5], [1.5, -0.1, 0.2, 0.0]]
    windows, after, counts, delta = change_one_cue_number(model, gate, [0.3, 0.2, 0.4, 0.6, -0.3, 0.0], 5, -1.0)
    assert torch.all(delta[counts == 0] == 0)  # tokens not yet seen: no change
    assert torch.all(delta[:, 0] == 0) and torch.all(delta[:, 1:][counts[:, 1:] > 0] < 0)  # the seen ones: log 1 = 0 at the first, then lowered, ...
    assert float(delta[0, 40][counts[0, 40] > 0].mean()) < float(delta[0, 5][counts[0, 5] > 0].mean())  # ... more late than early
    stats = copy_cache_statistics(model, windows, progress=False)
    assert torch.equal(stats["slot_count"].sum(-1), torch.arange(1, 50).repeat(3).float())  # t, from the slots alone
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(after[:, :-1].double().reshape(-1, 40), windows[:, 1:].reshape(-1))
        assert abs(float(seen_cached_nll(stats, model.copy_cache)) - float(want)) < 1e-5


@pytest.mark.parametrize("prior, rate, cap", [(False, False, 0), (True, False, 0), (False, True, 3), (True, True, 2)],
                         ids=["cue", "prior", "rate-cap", "prior-rate-cap"])
def test_the_fast_fit_loss_equals_its_reference_twin_and_its_gradients(prior, rate, cap):
    """The L-BFGS fit's loss from precomputed slot terms (fast_seen_cached_nll) is the model's own
    formula's (seen_cached_nll), value and gradients in both gates."""
    model = tiny_model()
    attach_copy_cache(model, [1, 3], 64, seen=True, continues_word=ODD_CONTINUES, log_prior=RAMP_PRIOR if prior else None,
                      rate=rate, count_cap=cap)
    with torch.no_grad():
        model.copy_cache.gate.copy_(torch.tensor([[0.5, 0.3, -0.4, -1.5, 0.4], [1.5, -0.1, 0.2, 0.0, -0.3]]))
        model.copy_cache.seen_gate.copy_(torch.tensor([0.3, 0.2, -0.4, 0.6, -0.3, -0.5])[: model.copy_cache.seen_gate.shape[0]])
    stats = copy_cache_statistics(model, torch.cat([repeating_windows(2, 50), torch.randint(0, 25, (1, 50))]), progress=False)
    head = model.copy_cache
    want = seen_cached_nll(stats, head)
    want_grads = torch.autograd.grad(want, [head.gate, head.seen_gate])
    got = fast_seen_cached_nll(slot_terms(stats, head, chunks=4), head)
    grads = torch.autograd.grad(got, [head.gate, head.seen_gate])
    torch.testing.assert_close(got, want)
    for grad, want_grad in zip(grads, want_grads):
        torch.testing.assert_close(grad, want_grad)


def test_slots_come_in_first_occurrence_order_and_the_fit_keeps_only_those_seen():
    """A window's slots are its distinct tokens as they first occur, so the tokens seen by any
    position are a prefix of them: the fit's slot terms keep those prefixes (fewer entries than
    every position times every slot) and their counts are the model's own."""
    assert window_slots(torch.tensor([7, 3, 7, 9, 3, 1])).tolist() == [7, 3, 9, 1]
    model = tiny_model()
    attach_copy_cache(model, [1, 3], 64, seen=True)
    windows = torch.randint(0, 40, (3, 60), generator=torch.Generator().manual_seed(5))
    stats = copy_cache_statistics(model, windows, progress=False)
    for w, ids in enumerate(windows):
        want = model.copy_cache_counts(ids[None, :-1])[0][:, window_slots(ids)]  # (L-1, S_w) the model's counts
        got = stats["slot_count"][w * 59 : (w + 1) * 59, : want.shape[1]]
        assert torch.equal(got, want)
        seen = (got > 0).sum(-1)  # (L-1,)
        assert torch.equal(got > 0, torch.arange(got.shape[1])[None] < seen[:, None])  # a prefix
    groups = slot_terms(stats, model.copy_cache, chunks=6)
    assert sum(len(g["target"]) for g in groups) == stats["slot_count"].shape[0]
    kept = sum(g["slot_logit"].numel() for g in groups)
    assert kept < 0.8 * stats["slot_count"].numel()


def test_the_rate_fit_reads_a_words_share_of_the_context():
    """Windows where a word's count grows with the window but its chance of coming next does not
    (a burst early, the same word spread thin later) against one where it rises with its share: the
    fit with the rate gives q < 0 and beats the fit without it."""
    gen = torch.Generator().manual_seed(2)
    rows = []
    for _ in range(6):
        word = int(torch.randint(30, 40, (1,), generator=gen))
        row = [word if (i < 40 and i % 2 == 1) or (i >= 40 and i % 40 == 39) else int(torch.randint(0, 30, (1,), generator=gen))
               for i in range(160)]  # every other token at first, then one in 40
        rows.append(torch.tensor(row))
    windows = torch.stack(rows)  # (6, 160)
    plain, with_rate = tiny_model(), tiny_model()
    attach_copy_cache(plain, [1], 64, seen=True)
    attach_copy_cache(with_rate, [1], 64, seen=True, rate=True)
    without = fit_copy_cache(plain, windows, steps=100, progress=False)
    fitted = fit_copy_cache(with_rate, windows, steps=100, progress=False)
    assert fitted["rate"] and not fitted["prior"] and len(fitted["seen_gate"]) == 5 and fitted["seen_gate"][4] < -0.1
    assert fitted["nll_after"] < without["nll_after"] - 0.03


def test_the_count_cap_bounds_what_a_count_adds():
    """Counts past the cap read as the cap: filler seen 167 times is raised no more than at cap."""
    model = tiny_model()
    attach_copy_cache(model, [1], 64, seen=True, count_cap=3)
    assert model.config.copy_cache_count_cap == 3 and model.copy_cache.seen_gate.shape == (4,)
    with torch.no_grad():
        model.copy_cache.seen_gate.copy_(torch.tensor([0.0, 0.0, 0.0, 1.0]))  # softplus(log min(count, 3))
        counts = torch.tensor([[0, 1, 2, 3, 5, 167]])
        boosts = model.copy_cache.seen_boosts(torch.zeros(1), torch.zeros(1, 6), counts)
    want = torch.nn.functional.softplus(torch.tensor([1.0, 1, 2, 3, 3, 3]).log()) * (counts > 0)
    torch.testing.assert_close(boosts, want)


def test_the_unigram_prior_counts_the_streams():
    prior = unigram_log_prior([torch.tensor([0, 0, 1]), [1, 1, 3]], 5)  # counts 2, 3, 0, 1, 0 over 6 tokens
    want = torch.tensor([2.5, 3.5, 0.5, 1.5, 0.5]) / (6 + 2.5)
    torch.testing.assert_close(prior, want.log())
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        unigram_log_prior([torch.tensor([0, 5])], 5)
    with pytest.raises(ValueError, match="no tokens"):
        unigram_log_prior([torch.tensor([], dtype=torch.long)], 5)


@pytest.mark.parametrize(
    "seen, continuation, prior, rate",
    [(False, False, False, False), (True, False, False, False), (True, True, False, False), (True, True, True, False),
     (True, False, False, True), (True, True, True, True)],
    ids=["ngram", "context-words", "continuation", "prior", "rate", "prior-rate-cap"],
)
def test_a_fitted_cache_saves_and_reloads_with_the_same_logits(tmp_path, seen, continuation, prior, rate):
    model = tiny_model()
    cap = 2 if prior and rate else 0
    attach_copy_cache(model, [1, 2], 128, seen=seen, continues_word=ODD_CONTINUES if continuation else None,
                      log_prior=RAMP_PRIOR if prior else None, rate=rate, count_cap=cap)
    fit_copy_cache(model, repeating_windows(2, 48), steps=20, progress=False)
    with torch.no_grad():
        if continuation:
            model.copy_cache.gate[:, 4] = 1.5  # a term the reload must not lose
        if prior:
            model.copy_cache.seen_gate[4] = -0.7
        if rate:
            model.copy_cache.seen_gate[-1] = -0.4
    model.save_pretrained(tmp_path)
    again = HallamonicForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.copy_cache_orders == [1, 2] and again.config.copy_cache_buckets == 128
    assert again.config.copy_cache_seen is seen and again.config.copy_cache_continuation is continuation
    assert again.config.copy_cache_prior is prior and again.config.copy_cache_rate is rate
    assert again.config.copy_cache_count_cap == cap and again.copy_cache.count_cap == cap
    if continuation:
        assert torch.equal(again.copy_cache.continues_word, ODD_CONTINUES)
    if prior:
        assert torch.equal(again.copy_cache.log_prior, RAMP_PRIOR)
    ids = repeating_windows(1, 40, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits)


def test_bad_orders_and_missing_ids_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="copy_cache_orders"):
        attach_copy_cache(model, [2, 2], 64)
    with pytest.raises(ValueError, match="copy_cache_seen"):
        attach_copy_cache(tiny_model(), [], 64, seen=True)
    with pytest.raises(ValueError, match="copy_cache_continuation"):
        attach_copy_cache(tiny_model(), [], 64, continues_word=ODD_CONTINUES)
    with pytest.raises(ValueError, match="one entry per vocabulary id"):
        attach_copy_cache(tiny_model(), [1], 64, continues_word=ODD_CONTINUES[:10])
    with pytest.raises(ValueError, match="copy_cache_prior"):
        attach_copy_cache(tiny_model(), [1], 64, log_prior=RAMP_PRIOR)  # the prior is a term of the context-word cue
    with pytest.raises(ValueError, match="copy_cache_rate"):
        attach_copy_cache(tiny_model(), [1], 64, rate=True)  # so is the rate
    with pytest.raises(ValueError, match="copy_cache_count_cap"):
        attach_copy_cache(tiny_model(), [1], 64, count_cap=16)  # and the cap
    with pytest.raises(ValueError, match="copy_cache_count_cap"):
        attach_copy_cache(tiny_model(), [1], 64, seen=True, count_cap=-1)
    with pytest.raises(ValueError, match="`log_prior` must have one entry"):
        attach_copy_cache(tiny_model(), [1], 64, seen=True, log_prior=RAMP_PRIOR[:10])
    with pytest.raises(ValueError, match="no copy cache"):
        fit_copy_cache(tiny_model(), repeating_windows(1, 24), progress=False)
    attach_copy_cache(model, [1], 64)
    with pytest.raises(ValueError, match="pass `input_ids`"):
        model(inputs_embeds=torch.zeros(1, 5, 32))
