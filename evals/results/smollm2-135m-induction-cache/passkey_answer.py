"""Why a passkey trial fails: the answer position's top tokens and what the copy cache adds to each.

For the first two passkey trials at a length (the package's own trials, seed 0), prints the
n-gram orders' predictions at the position before the key and, for the top five tokens after the
cache and the key's first token: the trunk's log p, the n-gram boost (orders agreeing add up), the
context-word cue's boost, the token's count in the context, its log prior (if the head has one) and
the final logit. Section 8 of README.md quotes it.

Usage (repository root): python evals/results/smollm2-135m-induction-cache/passkey_answer.py MODEL [LENGTH]
MODEL is a conversion's output folder with the copy cache and the context-word cue."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from hallamonic.evaluation.passkey import make_trials

sys.path.insert(0, str(Path(__file__).parent))
from fit_text_probe import load_run  # noqa: E402


@torch.no_grad()
def main() -> None:
    _, _, model, tokenizer = load_run(sys.argv[1])
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    head = model.copy_cache
    prior = getattr(head, "log_prior", None)  # checkpoints before the prior ship heads without it
    for prompt, answer in make_trials(tokenizer, length, 2, 0):
        ids = torch.tensor([prompt])  # (1, L)
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[:, -1:]  # (1, 1, H)
        logits = model.lm_head(hidden).float()  # (1, 1, V)
        preds = model.copy_cache_predictions(ids)[:, -1:]  # (1, 1, K)
        counts = model.copy_cache_counts(ids)[:, -1:]  # (1, 1, V)
        log_p = torch.log_softmax(logits, -1)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (1, 1)
        boosts = head.boosts(entropy, log_p.gather(-1, preds.clamp(min=0)), head.overruled(preds), head.continuation(preds))
        ngram = torch.zeros_like(logits).scatter_add(-1, preds.clamp(min=0), boosts * (preds >= 0))
        cue = head.seen_boosts(entropy, log_p, counts)
        final = (logits + ngram + cue)[0, 0]
        print("key", repr(tokenizer.decode(answer)), "orders predict",
              [tokenizer.decode([p]) if p >= 0 else None for p in preds[0, 0].tolist()], f"entropy {float(entropy):.2f}")
        for v in final.topk(5).indices.tolist() + [answer[0]]:
            print(f"  {tokenizer.decode([v])!r:12} log p {float(log_p[0, 0, v]):6.2f}  n-gram {float(ngram[0, 0, v]):5.2f}"
                  f"  cue {float(cue[0, 0, v]):5.2f}  count {int(counts[0, 0, v]):4d}"
                  f"  log prior {float(prior[v]) if prior is not None else float('nan'):6.2f}  final {float(final[v]):6.2f}")


if __name__ == "__main__":
    main()
