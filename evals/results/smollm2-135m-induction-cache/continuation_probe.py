"""Does the copy cache need to know when a copied token continues a word?

In LAMBADA passages the converted model often gets a name's first piece right and its second wrong:
after " Kar" it ranks "ab" above "ou" although " Karou" occurs three times in the passage, and the
order-1 prediction ("ou") gets a small boost because order-1 copies are unreliable on average
(after " the" anything may follow). After a word's first piece they are not: the word has already
begun, and its earlier spelling is the best guess. This probe gives every order one more gate term,
w_n [the copied token continues a word] (it starts with a letter, no space, digit or punctuation
before it: the product's `word_continuation_table`; --digits counts digit-first tokens too, the
first version), refits the product's head (n-gram gate
by Adam, then with the context-word cue by L-BFGS, as `fit_copy_cache` does) on the unseen fit
windows, and scores the package's evaluations.

Usage (repository root): python evals/results/smollm2-135m-induction-cache/continuation_probe.py MODEL
                          [--tasks bits,lambada,passkey] [--digits]
MODEL is a conversion's output folder with the copy cache (its training/ holds the token streams).
The fit runs twice on the same statistics, without the term (it must reproduce the product's own fit:
the control is the run's own evaluation) and with it; the model with it is scored."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hallamonic.convert.copy_cache import attach_copy_cache, copy_cache_statistics, fit_gate, word_continuation_table

sys.path.insert(0, str(Path(__file__).parent))
from cache_probe import recorder, score_tasks  # noqa: E402
from fit_text_probe import fit_windows, load_run  # noqa: E402

record = recorder("continuation_probe.jsonl")


def digits_too(tokenizer, vocab: int) -> torch.Tensor:
    """The first version of the table: a letter or a digit first (the product's takes letters only)."""
    anchor = tokenizer.encode("a", add_special_tokens=False)[-1]
    width = len(tokenizer.decode([anchor]))
    return torch.tensor([tokenizer.decode([anchor, v])[width:][:1].isalnum() for v in range(vocab)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tasks", default="bits,lambada,passkey")
    parser.add_argument("--digits", action="store_true", help="count digit-first tokens as continuing a word (the first version)")
    args = parser.parse_args()
    run, recipe, model, tokenizer = load_run(args.model)
    table = word_continuation_table(tokenizer, model.config.vocab_size) if not args.digits else digits_too(tokenizer, model.config.vocab_size)
    windows = fit_windows("unseen", run, recipe, tokenizer)
    cache = recipe.copy_cache
    attach_copy_cache(model, cache.orders, cache.buckets, cache.seen, table)  # the product's head, with the term
    stats = copy_cache_statistics(model, windows, progress=False)
    share = round(float(stats["continues"][stats["valid"]].mean()), 4)  # of the predictions made
    for cue in (False, True):  # without the term first: it must reproduce the product's own fit
        head, report = fit_gate(stats, cache.orders, seen=cache.seen, continuation=cue, steps=cache.fit_steps, lr=cache.fit_lr)
        record({"model": run.name, "continuation_cue": cue, "digits": args.digits, "task": "fit",
                "table_share": round(float(table.float().mean()), 4), "continuation_share": share} | report)
    with torch.no_grad():
        model.copy_cache.gate.copy_(head.gate)
        model.copy_cache.seen_gate.copy_(head.seen_gate)
    score_tasks(model, tokenizer, args.tasks.split(","), {"model": run.name, "continuation_cue": True, "digits": args.digits}, record, [1024])


if __name__ == "__main__":
    main()
