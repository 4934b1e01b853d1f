"""Where a converted model's passkey misses: per answer token of each trial, whether the greedy token
is right (else the winner and its margin in nats), and with a copy cache the model's own log p of the
right token, its own top token and each order's cached prediction.

Usage (repository root): python evals/results/smollm2-135m-induction-cache/passkey_where.py MODEL [LENGTH=1024]"""
import sys
import torch
from hallamonic.evaluation import passkey as pk
from hallamonic.loading import load_causal_lm

torch.set_num_threads(2)
model, tok = load_causal_lm(sys.argv[1])[:2]
model.eval()
length = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
for prompt, answer in pk.make_trials(tok, length, 10, 0):
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (A, V)
        base = None
        if model.copy_cache is not None:
            cache, model.copy_cache = model.copy_cache, None
            base = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            model.copy_cache = cache
            preds = model.copy_cache_predictions(ids, None, None, update=False)[0, len(prompt) - 1 : -1]  # (A, K)
    row = []
    for j, t in enumerate(answer):
        top = int(logits[j].argmax())
        mark = "ok" if top == t else f"MISS top={tok.decode([top])!r} gap={float(logits[j, top] - logits[j, t]):.2f}"
        extra = ""
        if base is not None:
            lp = torch.log_softmax(base[j], -1)
            extra = f" base_lp={float(lp[t]):.1f} base_top={tok.decode([int(base[j].argmax())])!r} cache={[tok.decode([int(p)]) if p >= 0 else '-' for p in preds[j]]}"
        row.append(f"  {tok.decode([t])!r}: {mark}{extra}")
    print(tok.decode(answer), "\n" + "\n".join(row))
