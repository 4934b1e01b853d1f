"""LAMBADA (OpenAI) last-word prediction, scored exactly like lm-eval-harness.

The harness protocol (task `lambada_openai`): context = the passage without its last word,
target = " " + last word; tokens come from encoding context+target once and splitting at the
context's length (so the word boundary tokenizes naturally). accuracy = every target token is
the greedy argmax; perplexity = exp(mean over passages of the target's summed NLL).
Matching the harness token for token is what makes our numbers comparable with published ones.
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from hallamonic.evaluation.scoring import run_guard, score_tokens


def split_passage(text: str) -> tuple[str, str]:
    """(context, target): the harness splits on single spaces, not on any whitespace."""
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def encode_pair(tokenizer, context: str, target: str) -> tuple[list[int], list[int]]:
    """Token ids of (context, target) as lm-eval-harness's HFLM builds them.

    Trailing spaces move from the context to the target; the tokenizer's own default for
    special tokens applies (a BOS for Llama tokenizers, none for SmolLM2); an empty context
    becomes the BOS (or EOS) token alone.
    """
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, target = context[:-n_spaces], context[-n_spaces:] + target
    if not context:
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        return [prefix], tokenizer.encode(target, add_special_tokens=False)
    whole = tokenizer.encode(context + target)
    context_ids = tokenizer.encode(context)
    return context_ids, whole[len(context_ids) :]


def score_batch(model, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
    """(target NLL in nats, all-greedy) per pair, from one right-padded forward.

    Right padding needs no attention mask: every model here is causal, so pad tokens after a
    sequence cannot change the predictions inside it.
    """
    seqs = [ctx + tgt for ctx, tgt in pairs]
    width = max(len(s) for s in seqs)
    batch = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, L) right-padded with id 0
    for row, seq in enumerate(seqs):
        batch[row, : len(seq)] = torch.tensor(seq)
    nll, hit = score_tokens(model, batch)  # (B, L-1) each
    out = []
    for row, (ctx, tgt) in enumerate(pairs):
        span = slice(len(ctx) - 1, len(ctx) + len(tgt) - 1)  # predictions of the target tokens
        out.append((float(nll[row, span].sum()), bool(hit[row, span].all())))
    return out


def evaluate_lambada(
    model,
    tokenizer,
    texts: list[str],
    *,
    batch_size: int = 8,
    max_attention_length: int | None = None,
    progress: bool = True,
) -> dict:
    """Accuracy and perplexity over `texts`; passages the model cannot take are skipped."""
    pairs = [encode_pair(tokenizer, *split_passage(t)) for t in texts]
    runnable = [i for i, p in enumerate(pairs) if run_guard(model, len(p[0]) + len(p[1]), max_attention_length) is None]
    order = sorted(runnable, key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))  # similar lengths batch together
    correct: list[bool | None] = [None] * len(pairs)  # per passage, in input order (None = skipped)
    nlls = []
    bar = tqdm(total=len(order), desc="lambada", unit="passage", disable=not progress)
    for lo in range(0, len(order), batch_size):
        indices = order[lo : lo + batch_size]
        for i, (nll, hit) in zip(indices, score_batch(model, [pairs[i] for i in indices])):
            nlls.append(nll)
            correct[i] = hit
        bar.update(len(indices))
    bar.close()
    n = len(nlls)
    result = {
        "task": "lambada",
        "accuracy": sum(hit for hit in correct if hit) / n if n else float("nan"),
        "perplexity": math.exp(sum(nlls) / n) if n else float("nan"),
        "n": n,
        # per passage: why -- two models scored on the same passages compare paired (McNemar), which
        # resolves a difference several times smaller than two independent accuracies' errors do
        "correct": correct,
    }
    if len(pairs) > n:
        result["skipped"] = len(pairs) - n
    return result


def paired_comparison(correct_a: list[bool | None], correct_b: list[bool | None]) -> dict:
    """McNemar's exact test of two LAMBADA runs on the same passages (their ``correct`` lists).

    Why paired: both models see the same passages, so only the passages one gets and the other
    misses carry evidence of a difference; their split is Binomial(discordant, 1/2) when the models
    are equally good. Passages either run skipped are left out.
    """
    if len(correct_a) != len(correct_b):
        raise ValueError(f"the runs scored different passage lists ({len(correct_a)} vs {len(correct_b)} passages)")
    pairs = [(a, b) for a, b in zip(correct_a, correct_b) if a is not None and b is not None]
    only_a = sum(a and not b for a, b in pairs)
    only_b = sum(b and not a for a, b in pairs)
    discordant, low = only_a + only_b, min(only_a, only_b)
    tail = sum(math.comb(discordant, k) for k in range(low + 1)) / 2**discordant  # P(X <= low), X ~ Bin(d, 1/2)
    return {
        "n": len(pairs),
        "both": sum(a and b for a, b in pairs),
        "only_a": only_a,
        "only_b": only_b,
        "p_value": min(1.0, 2 * tail),  # two-sided
    }
