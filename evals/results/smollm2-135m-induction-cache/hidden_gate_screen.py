"""Screen: does a gate that also reads the model's final hidden state beat entropy + log p?

The gate's logit per order gets w_n . standardise(h_t), h_t the trunk's last (normed) hidden state, 576
numbers per order. With that many weights the fit text's NLL says little, so the probe's 48 fit windows
are split: fitted on the first 36, scored on the last 12 (never fitted). Compared with the product's
entropy + log p gate on the same split; without a penalty on w the fit diverges (NaN), with
1e-3 * |w|^2 it fits. Usage (from the repository root): python evals/results/smollm2-135m-induction-cache/hidden_gate_screen.py MODEL
"""
import random, sys, time
from pathlib import Path
from types import SimpleNamespace
import torch
from torch import nn
sys.path.insert(0, str(Path(__file__).parent))
import cache_probe as cp
from hallamonic.evaluation.context import token_stream
from hallamonic.loading import load_causal_lm

torch.set_num_threads(2)
model, tok = load_causal_lm(sys.argv[1])[:2]
model.eval()
orders = [1, 2, 3, 4, 6, 8]
train = (cp.DATA / "fineweb_edu_head_train.txt").read_text().split("\n\n")
random.Random(0).shuffle(train)
stream = token_stream(tok, train[:2000])
windows = [stream[i * 1024:(i + 1) * 1024] for i in range(48)]
hidden_parts = []

class Wrap:
    def __call__(self, input_ids, use_cache=False):
        h = model.model(input_ids=input_ids).last_hidden_state  # (1, L, H)
        hidden_parts.append(h[0, :-1].float())
        return SimpleNamespace(logits=model.lm_head(h))

with torch.no_grad():
    stats = cp.fit_statistics(Wrap(), windows, orders)
stats["hidden"] = torch.cat(hidden_parts)
P = stats["lse"].shape[0]
cut = 36 * 1023
fit = {k: v[:cut] for k, v in stats.items()}
test = {k: v[cut:] for k, v in stats.items()}
mu, sd = fit["hidden"].mean(0), fit["hidden"].std(0) + 1e-4

class HiddenGate(cp.CacheGate):
    def __init__(self, K, H, hidden=True, rank=None):
        super().__init__(K, True, False, False, True)
        self.use_hidden = hidden
        self.w = nn.Parameter(torch.zeros(K, H))
        self.h = None
    def betas(self, entropy, streaks=None, logp=None, counts=None, ages=None):
        x = self.order_weights[:, 0] + self.order_weights[:, 1] * entropy[..., None] + self.logp_weights * logp.clamp(min=-30)
        if self.use_hidden:
            x = x + ((self.h - mu) / sd) @ self.w.T
        return nn.functional.softplus(x)

def nll(stats, gate):
    gate.h = stats["hidden"]
    return cp.cached_nll(stats, gate)

for name, hidden, steps, lr, l2 in [("entropy-logp", False, 400, 0.05, 0), ("hidden", True, 600, 0.02, 0), ("hidden-l2", True, 600, 0.02, 1e-3)]:
    torch.manual_seed(0)
    gate = HiddenGate(len(orders), stats["hidden"].shape[1], hidden)
    opt = torch.optim.Adam(gate.parameters(), lr=lr)
    t = time.time()
    for step in range(steps):
        loss = nll(fit, gate) + l2 * gate.w.pow(2).sum()
        opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        print(name, "fit", round(float(nll(fit, gate)), 4), "test", round(float(nll(test, gate)), 4),
              "base test", round(float((test["lse"] - test["target"]).mean()), 4), round(time.time() - t, 1), "s", flush=True)
