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
    runnable = [p for p in pairs if run_guard(model, len(p[0]) + len(p[1]), max_attention_length) is None]
    order = sorted(range(len(runnable)), key=lambda i: len(runnable[i][0]) + len(runnable[i][1]))
    nlls, hits = [], []
    bar = tqdm(total=len(order), desc="lambada", unit="passage", disable=not progress)
    for lo in range(0, len(order), batch_size):
        chunk = [runnable[i] for i in order[lo : lo + batch_size]]
        for nll, hit in score_batch(model, chunk):
            nlls.append(nll)
            hits.append(hit)
        bar.update(len(chunk))
    bar.close()
    n = len(nlls)
    result = {
        "task": "lambada",
        "accuracy": sum(hits) / n if n else float("nan"),
        "perplexity": math.exp(sum(nlls) / n) if n else float("nan"),
        "n": n,
    }
    if len(pairs) > n:
        result["skipped"] = len(pairs) - n
    return result
