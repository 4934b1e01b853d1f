"""Give a converted model the copy cache and fit its gate (the conversion's last step).

The converted blocks do not copy: a span of text seen before is predicted no better the second
time (evals/results/smollm2-135m-copy). The copy cache (``hallamonic_copy_cache.py``) recalls,
for each n-gram order, the token that followed the last earlier occurrence of the current n
tokens; :class:`CopyCacheHead` raises its logit by softplus(a_n + b_n H_t + f_n log p_t(v_n) + o_n
[overruled]), H_t the model's own entropy, p_t(v_n) its own probability of that token and the last
term on when a longer order predicts another token. Only those 4 x orders numbers are fitted, by cross-entropy on training text with the model's logits fixed, so the fit
needs one forward over the windows and then seconds: per scored position it keeps the logsumexp,
the entropy, the target's logit and the predicted tokens' logits, from which the cached model's
loss follows exactly for any gate (``cached_nll``).

Attached after phase 2, not before: a cache present while the blocks train would cost every
phase-2 step a full-vocabulary entropy, and its gate starts closed anyway.
"""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from hallamonic.modeling.modeling_hallamonic import CopyCacheHead, HallamonicForCausalLM


# The fit starts every order at a boost of softplus(-2) = 0.13 nats, not at the closed gate the
# model is built with: there softplus's slope is 5e-5 and the fit stopped short (SmolLM2, the recipe's 48 windows:
# 3.2410 nats/token from the closed gate, 3.2393 from here, long orders then open where the model is sure).
FIT_START = (-2.0, 0.0, 0.0, 0.0)


def attach_copy_cache(model: HallamonicForCausalLM, orders: list[int], buckets: int) -> CopyCacheHead:
    """Add a closed copy cache (gate at its init) to `model` and record it in the config."""
    model.config.copy_cache_orders, model.config.copy_cache_buckets = list(orders), buckets
    model.config._validate_hallamonic()
    device = model.lm_head.weight.device
    model.copy_cache = CopyCacheHead(list(orders)).to(device)
    return model.copy_cache


@torch.no_grad()
def copy_cache_statistics(model: HallamonicForCausalLM, windows: torch.Tensor, progress: bool = True) -> dict:
    """What the gate's fit needs, per scored position of windows (W, L): the model's logits
    without the cache reduced to logsumexp, entropy, target logit and the K predicted tokens'
    logits, which predictions exist, agree with each other, are overruled by a longer order and hit
    the target."""
    keys = ("lse", "entropy", "target", "pred_logit", "valid", "same", "overruled", "hit")
    parts: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
    device = model.lm_head.weight.device
    for ids in tqdm(windows, desc="copy cache statistics", unit="window", disable=not progress):
        ids = ids[None].to(device)  # (1, L)
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # (1, L, H)
        logits = model.lm_head(hidden).float()[0, :-1]  # (L-1, V): position t predicts t+1
        preds = model.copy_cache_predictions(ids)[0, :-1]  # (L-1, K)
        target = ids[0, 1:]  # (L-1,)
        valid = preds >= 0
        parts["lse"].append(torch.logsumexp(logits, -1))
        parts["entropy"].append(CopyCacheHead.entropy(logits))
        parts["target"].append(logits.gather(-1, target[:, None])[:, 0])
        parts["pred_logit"].append(logits.gather(-1, preds.clamp(min=0)))
        parts["valid"].append(valid)
        parts["same"].append((preds[:, :, None] == preds[:, None, :]) & valid[:, :, None] & valid[:, None, :])
        parts["overruled"].append(model.copy_cache.overruled(preds))
        parts["hit"].append((preds == target[:, None]) & valid)
    return {key: torch.cat(value).cpu() for key, value in parts.items()}


def cached_nll(stats: dict, head: CopyCacheHead) -> torch.Tensor:
    """Mean next-token NLL (nats) of the model with `head` on the statistics' positions; exact
    (equal to scoring the cached model's logits), differentiable in the gate."""
    log_p = stats["pred_logit"] - stats["lse"][:, None]  # (P, K): the model's log p of each predicted token
    boosts = head.boosts(stats["entropy"], log_p, stats["overruled"]) * stats["valid"]  # (P, K)
    same = stats["same"].float()  # (P, K, K)
    total = (same @ boosts[:, :, None])[..., 0]  # (P, K): each predicted token's boost, agreeing orders summed
    once = stats["valid"].float() / same.sum(-1).clamp(min=1)  # a token several orders predict counts once
    lse = stats["lse"] + torch.log1p((once * log_p.exp() * total.expm1()).sum(-1))
    target = stats["target"] + (stats["hit"].float() * boosts).sum(-1)
    return (lse - target).mean()


def fit_copy_cache(
    model: HallamonicForCausalLM, windows: torch.Tensor, *, steps: int = 400, lr: float = 0.05, progress: bool = True
) -> dict:
    """Fit the attached copy cache's gate on windows (W, L) of training text; returns a report."""
    if model.copy_cache is None:
        raise ValueError("fit_copy_cache: the model has no copy cache; call attach_copy_cache first")
    began = time.perf_counter()
    stats = copy_cache_statistics(model, windows, progress=progress)
    head = CopyCacheHead(model.config.copy_cache_orders)
    with torch.no_grad():
        head.gate.copy_(torch.tensor([FIT_START] * len(model.config.copy_cache_orders)))
        before = float((stats["lse"] - stats["target"]).mean())
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(steps):
        loss = cached_nll(stats, head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = float(cached_nll(stats, head))
        model.copy_cache.gate.copy_(head.gate.to(model.copy_cache.gate))
    return {
        "orders": list(model.config.copy_cache_orders),
        "buckets": model.config.copy_cache_buckets,
        "gate": [[round(x, 4) for x in row] for row in head.gate.tolist()],  # per order: a_n, b_n, f_n, o_n
        "fit_tokens": int(stats["lse"].numel()),
        "nll_before": round(before, 4),
        "nll_after": round(after, 4),
        "matched_share": round(float(stats["valid"].any(-1).float().mean()), 4),  # positions with any prediction
        "seconds": round(time.perf_counter() - began, 1),
    }

