"""LAMBADA: the harness's context/target split and tokenization, and hand-checked scores."""

from __future__ import annotations

import json
import math

import pytest
import torch

from evaltiny import build_llama
from hallamonic.evaluation.lambada import encode_pair, evaluate_lambada, paired_comparison, split_passage


def test_split_passage_uses_single_spaces_like_the_harness():
    assert split_passage("he said  hello world") == ("he said  hello", " world")
    assert split_passage("one") == ("", " one")


def test_encode_pair_splits_the_whole_encoding(tokenizer):
    context, target = split_passage("the old man looked at the sea")
    ctx, tgt = encode_pair(tokenizer, context, target)
    assert ctx + tgt == tokenizer.encode(context + target)
    assert ctx[0] == tokenizer.bos_token_id  # the tokenizer's default special tokens apply
    assert tokenizer.decode(tgt) == " sea"
    ctx, tgt = encode_pair(tokenizer, "the sea ", "wave")  # trailing space moves to the target
    assert tokenizer.decode(tgt) == " wave"


def test_uniform_model_has_hand_computed_accuracy_and_perplexity(tokenizer, lambada_file):
    """Zero final-norm weight makes every logit 0: each target token costs exactly ln V."""
    model = build_llama(len(tokenizer))
    with torch.no_grad():
        model.model.norm.weight.zero_()
    texts = [json.loads(line)["text"] for line in lambada_file.read_text().splitlines()]
    n_tokens = [len(tokenizer.encode(" " + t.split(" ")[-1], add_special_tokens=False)) for t in texts]
    result = evaluate_lambada(model, tokenizer, texts, batch_size=3, progress=False)
    expected_ppl = math.exp(math.log(len(tokenizer)) * sum(n_tokens) / len(texts))
    assert result["n"] == len(texts)
    assert result["accuracy"] == 0.0  # argmax of equal logits is id 0 (<unk>), never a target
    assert math.isclose(result["perplexity"], expected_ppl, rel_tol=1e-5)


def test_batched_scores_match_an_independent_per_passage_computation(tokenizer, llama, lambada_file):
    texts = [json.loads(line)["text"] for line in lambada_file.read_text().splitlines()]
    nlls, hits = [], []
    for text in texts:  # one passage at a time, full logits, float64
        words = text.split(" ")
        whole = tokenizer.encode(text)
        n_ctx = len(tokenizer.encode(" ".join(words[:-1])))
        with torch.no_grad():
            logp = llama(torch.tensor([whole])).logits[0].double().log_softmax(-1)  # (L, V)
        rows = logp[n_ctx - 1 : len(whole) - 1]  # predictions of the target tokens
        target = torch.tensor(whole[n_ctx:])
        nlls.append(-rows.gather(1, target[:, None]).sum().item())
        hits.append(bool((rows.argmax(-1) == target).all()))
    result = evaluate_lambada(llama, tokenizer, texts, batch_size=3, progress=False)
    assert result["accuracy"] == sum(hits) / len(hits)
    assert result["correct"] == hits  # per passage, in the input order (scoring runs sorted by length)
    assert math.isclose(result["perplexity"], math.exp(sum(nlls) / len(nlls)), rel_tol=1e-4)


def test_passages_past_a_position_table_are_skipped_not_crashed(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=8, n_embd=32, n_layer=1, n_head=2)).eval()
    texts = ["a b", "a much longer passage that cannot fit into eight positions at all"]
    result = evaluate_lambada(model, tokenizer, texts, progress=False)
    assert result["n"] == 1 and result["skipped"] == 1
    assert result["correct"][1] is None and isinstance(result["correct"][0], bool)


def test_paired_comparison_counts_discordant_passages_and_gives_mcnemars_exact_p():
    a = [True] * 10 + [False] * 2 + [True] * 5 + [None]
    b = [False] * 10 + [True] * 2 + [True] * 5 + [True]
    result = paired_comparison(a, b)
    assert (result["n"], result["both"], result["only_a"], result["only_b"]) == (17, 5, 10, 2)
    assert result["p_value"] == pytest.approx(2 * (1 + 12 + 66) / 4096)  # 2 P(X <= 2), X ~ Bin(12, 1/2)
    assert paired_comparison([True, False], [True, False])["p_value"] == 1.0  # no discordant passage
    with pytest.raises(ValueError, match="different passage lists"):
        paired_comparison([True], [True, False])
