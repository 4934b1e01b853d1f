"""Passkey retrieval: prompt construction, and scoring checked with oracle models."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from hallamonic.evaluation.passkey import evaluate_passkey, make_trial, make_trials


class PeekingLM(nn.Module):
    """Logits that put all mass on the actual next token (or, `wrong`, on the one after it).

    Not causal on purpose: it shows that scoring reads exactly the answer positions.
    """

    def __init__(self, vocab: int, wrong: bool = False, miss_first_of: int = 0):
        super().__init__()
        self.config = SimpleNamespace(model_type="peek")
        self.dummy = nn.Parameter(torch.zeros(1))
        self.vocab, self.wrong, self.miss_first_of = vocab, wrong, miss_first_of

    def forward(self, input_ids, **_):
        nxt = torch.roll(input_ids, -1 - int(self.wrong), dims=1)  # (B, L)
        if self.miss_first_of:  # wrong only on the first token of an answer this many tokens long
            at = input_ids.shape[1] - 1 - self.miss_first_of
            nxt[:, at] = (nxt[:, at] + 1) % self.vocab
        return SimpleNamespace(logits=nn.functional.one_hot(nxt, self.vocab).float() * 10)  # (B, L, V)


def test_trial_fits_the_length_and_hides_the_key(tokenizer):
    prompt, answer = make_trial(tokenizer, 600, depth=0.3, key="52817")
    assert 540 <= len(prompt) + len(answer) <= 600
    assert tokenizer.decode(answer) == " 52817"
    text = tokenizer.decode(prompt)
    assert text.count("52817") == 2 and text.endswith("The pass key is")
    assert text.index("52817") < len(text) * 0.5  # depth 0.3 of the filler


def test_trials_are_seeded_and_shared_across_models(tokenizer):
    assert make_trials(tokenizer, 300, 3, seed=1) == make_trials(tokenizer, 300, 3, seed=1)
    assert make_trials(tokenizer, 300, 3, seed=1) != make_trials(tokenizer, 300, 3, seed=2)


def test_oracles_score_one_and_zero(tokenizer):
    right = evaluate_passkey(PeekingLM(len(tokenizer)), tokenizer, [256, 384], trials=3, progress=False)
    wrong = evaluate_passkey(PeekingLM(len(tokenizer), wrong=True), tokenizer, [256, 384], trials=3, progress=False)
    assert right["accuracy"] == {"256": 1.0, "384": 1.0} and right["trials"] == 3
    assert right["key_tokens"] == {"256": 1.0, "384": 1.0}
    assert wrong["accuracy"] == {"256": 0.0, "384": 0.0}


def test_key_tokens_give_partial_credit_where_accuracy_gives_none(tokenizer):
    (_, answer), = make_trials(tokenizer, 256, 1, seed=0)
    model = PeekingLM(len(tokenizer), miss_first_of=len(answer))  # every key token right but the first
    result = evaluate_passkey(model, tokenizer, [256], trials=1, progress=False)
    assert len(answer) > 1
    assert result["accuracy"] == {"256": 0.0}
    assert abs(result["key_tokens"]["256"] - (len(answer) - 1) / len(answer)) < 1e-6


def test_random_llama_runs_and_marks_out_of_range_lengths(llama, tokenizer):
    lengths = [384, 256, 64]
    result = evaluate_passkey(llama, tokenizer, lengths, trials=2, max_attention_length=300, progress=False)
    assert list(result["accuracy"]) == ["256"] and 0.0 <= result["accuracy"]["256"] <= 1.0
    assert 230 <= result["prompt_tokens"]["256"] <= 256
    assert "max-attention-length" in result["not_run"]["384"]
    assert "without filler" in result["not_run"]["64"]
