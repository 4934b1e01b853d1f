"""Does a context-word cue that reads the model's own probabilities help LAMBADA and the held-out bits?

LAMBADA's target word occurs earlier in 251 of the first 300 passages, but only 66 times after the
same token as now: the n-gram copy cache cannot find it. The first unigram cue (`cache_probe.py`,
gate `entropy-seen`) raised every token already in the context by one amount per position,
softplus(c + d H_t): 0.009 bits, LAMBADA perplexity, no accuracy. Here the amount depends on the
token too, the way the n-gram gate reads log p:

    gamma_t(v) = softplus(c + d H_t + e log p_t(v) + g log count_t(v))     for v already in the context,

count_t(v) the number of times v occurred in ids[..t]. e > 0 re-ranks the model's own candidates by
whether the context holds them (LAMBADA's case); e < 0 raises unlikely context words (names).

The fit is exact and cheap because every token the cue or the n-gram orders raise is a token of the
window: per position, the logits of the window's distinct tokens (at most ~700 slots), which of them
are seen so far and how often, plus the log-sum-exp of every other token. The n-gram gate is the
product's (entropy + log p + overrule, `CopyCacheHead`), refitted jointly. Also printed: the base
model's NLL on the fit text at a few softmax temperatures (is it miscalibrated?).

Usage: python seen_probe.py MODEL [--gates ngram,ngram-seen,ngram-seen-logp,ngram-seen-logp-count]
                                  [--tasks bits,lambada,passkey] [--score best|all] [--fit-windows 48]
Appends one line per (model, variant, task) to seen_probe.jsonl.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from tqdm.auto import tqdm

from cache_probe import DATA, CacheGate, entropy_of, ngram_predictions, overruled, recorder, score_tasks
from hallamonic.evaluation.context import token_stream
from hallamonic.loading import load_causal_lm

HERE = Path(__file__).parent
TEMPERATURES = (0.9, 0.95, 1.0, 1.05, 1.1)


class SeenGate(nn.Module):
    """gamma_t(v) = softplus(c + d H_t + e log p_t(v) + g log count_t(v)); unused cues stay 0."""

    def __init__(self, logp: bool, count: bool):
        super().__init__()
        self.logp, self.count = logp, count
        self.weights = nn.Parameter(torch.tensor([-4.0, 0.0, 0.0, 0.0]))  # c, d, e, g

    def forward(self, entropy: torch.Tensor, log_p: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """entropy (...) and log p, count (..., S) -> (..., S) boosts."""
        c, d, e, g = self.weights.unbind()
        x = c + d * entropy[..., None]
        if self.logp:
            x = x + e * log_p.clamp(min=-30)
        if self.count:
            x = x + g * count.clamp(min=1).log()
        return nn.functional.softplus(x)

    def describe(self) -> dict:
        return {"seen_c_d_e_g": [round(x, 3) for x in self.weights.tolist()]}


GATES = {  # name -> (seen cue?, its log p term?, its count term?)
    "ngram": (False, False, False),
    "ngram-seen": (True, False, False),
    "ngram-seen-logp": (True, True, False),
    "ngram-seen-count": (True, False, True),
    "ngram-seen-logp-count": (True, True, True),
}


def running_counts(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, L, V) float: how many times each token occurred in ids[.., :t+1]."""
    return nn.functional.one_hot(ids, vocab).float().cumsum(1)


@torch.no_grad()
def slot_statistics(model, windows: list[list[int]], orders: list[int]) -> dict:
    """Per fit position, over the window's distinct tokens (slots, padded to the widest window):
    their logits, whether each is seen yet and how often; the log-sum-exp over every unseen token;
    the entropy and full log-sum-exp; the slot of each order's prediction and of the target."""
    rows = {k: [] for k in ("slot_logit", "slot_count", "lse_unseen", "lse", "entropy", "pred_slot",
                            "valid", "overruled", "target_slot", "target_logit")}
    nll_at = {t: 0.0 for t in TEMPERATURES}
    positions = 0
    for window in tqdm(windows, desc="fit windows", unit="window"):
        ids = torch.tensor([window])  # (1, L)
        logits = model(input_ids=ids, use_cache=False).logits.float()[0, :-1]  # (L-1, V)
        target = ids[0, 1:]  # (L-1,)
        for t in TEMPERATURES:
            nll_at[t] += float((torch.logsumexp(logits / t, -1) - logits.gather(-1, target[:, None])[:, 0] / t).sum())
        positions += len(target)
        distinct = torch.unique(ids[0])  # (S,) the window's tokens: the only ones a cue can raise
        counts = running_counts(ids[:, :-1], logits.shape[-1])[0]  # (L-1, V)
        seen = counts > 0
        preds = ngram_predictions(ids, orders)[0, :-1]  # (L-1, K)
        slot_of = torch.full((logits.shape[-1],), -1, dtype=torch.long)
        slot_of[distinct] = torch.arange(len(distinct))
        rows["slot_logit"].append(logits[:, distinct])
        rows["slot_count"].append(counts[:, distinct])
        rows["lse_unseen"].append(torch.logsumexp(logits.masked_fill(seen, float("-inf")), -1))
        rows["lse"].append(torch.logsumexp(logits, -1))
        rows["entropy"].append(entropy_of(logits))
        rows["pred_slot"].append(torch.where(preds >= 0, slot_of[preds.clamp(min=0)], 0))
        rows["valid"].append(preds >= 0)
        rows["overruled"].append(overruled(preds[None])[0])
        rows["target_slot"].append(torch.where(seen.gather(-1, target[:, None])[:, 0], slot_of[target], -1))
        rows["target_logit"].append(logits.gather(-1, target[:, None])[:, 0])
    width = max(part.shape[1] for part in rows["slot_logit"])
    pad = lambda part, value: nn.functional.pad(part, (0, width - part.shape[1]), value=value)  # noqa: E731
    stats = {k: torch.cat([pad(p, float("-inf")) for p in v]) if k == "slot_logit"
             else torch.cat([pad(p, 0.0) for p in v]) if k == "slot_count" else torch.cat(v) for k, v in rows.items()}
    stats["nll_at_temperature"] = {t: round(v / positions, 4) for t, v in nll_at.items()}
    return stats


def slot_nll(stats: dict, ngram: CacheGate, seen_gate: SeenGate | None) -> torch.Tensor:
    """Mean NLL (nats) of the model with both cues, exact, differentiable in both gates."""
    log_p_slots = stats["slot_logit"] - stats["lse"][:, None]  # (P, S)
    pred_logp = log_p_slots.gather(-1, stats["pred_slot"])  # (P, K)
    betas = ngram.betas(stats["entropy"], None, pred_logp, None, None, stats["overruled"]) * stats["valid"]
    active = stats["slot_count"] > 0  # (P, S)
    z = stats["slot_logit"].scatter_add(-1, stats["pred_slot"], betas)  # orders agreeing add up
    if seen_gate is not None:
        z = z + seen_gate(stats["entropy"], log_p_slots, stats["slot_count"]) * active
    z_seen = z.masked_fill(~active, float("-inf"))
    lse = torch.logaddexp(stats["lse_unseen"], torch.logsumexp(z_seen, -1))
    has = stats["target_slot"] >= 0
    target = torch.where(has, z.gather(-1, stats["target_slot"].clamp(min=0)[:, None])[:, 0], stats["target_logit"])
    return (lse - target).mean()


def fit(stats: dict, ngram: CacheGate, seen_gate: SeenGate | None, iterations: int = 60) -> float:
    """L-BFGS on the few gate numbers (an Adam step over ~35M slot entries costs ~1 s here)."""
    params = list(ngram.parameters()) + (list(seen_gate.parameters()) if seen_gate is not None else [])
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=iterations, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = slot_nll(stats, ngram, seen_gate)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(slot_nll(stats, ngram, seen_gate))


class SeenCachedLM(nn.Module):
    """The wrapped causal LM with the n-gram boosts and the context-word cue added to its logits."""

    def __init__(self, model: nn.Module, orders: list[int], ngram: CacheGate, seen_gate: SeenGate | None):
        super().__init__()
        self.model, self.orders, self.ngram, self.seen_gate, self.config = model, orders, ngram, seen_gate, model.config

    def forward(self, input_ids: torch.Tensor, **kwargs) -> SimpleNamespace:
        logits = self.model(input_ids=input_ids, **kwargs).logits.float()  # (B, L, V)
        log_p = torch.log_softmax(logits, -1)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (B, L)
        preds = ngram_predictions(input_ids.cpu(), self.orders).to(logits.device)  # (B, L, K)
        betas = self.ngram.betas(entropy, None, log_p.gather(-1, preds.clamp(min=0)), None, None, overruled(preds))
        out = logits.scatter_add(-1, preds.clamp(min=0), betas * (preds >= 0))
        if self.seen_gate is not None:
            counts = running_counts(input_ids, logits.shape[-1])  # (B, L, V); padding counts too, as a cache would
            out = out + self.seen_gate(entropy, log_p, counts) * (counts > 0)
        return SimpleNamespace(logits=out)


record = recorder("seen_probe.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--orders", default="1,2,3,4,6,8")
    parser.add_argument("--fit-windows", type=int, default=48)
    parser.add_argument("--gates", default="ngram,ngram-seen,ngram-seen-logp,ngram-seen-logp-count")
    parser.add_argument("--tasks", default="bits,lambada,passkey", help="comma list, or none")
    parser.add_argument("--score", default="best", help="best = score `ngram` and the seen gate that fits best | all")
    args = parser.parse_args()
    torch.set_num_threads(2)
    orders = [int(n) for n in args.orders.split(",")]
    model, tokenizer = load_causal_lm(args.model)[:2]
    model.eval()
    model.copy_cache = None  # the probe brings its own
    train = (DATA / "fineweb_edu_head_train.txt").read_text().split("\n\n")
    random.Random(0).shuffle(train)  # the same fit windows as cache_probe.py
    stream = token_stream(tokenizer, train[:2000])
    windows = [stream[i * 1024 : (i + 1) * 1024] for i in range(args.fit_windows)]
    start = time.time()
    stats = slot_statistics(model, windows, orders)
    base = float((stats["lse"] - stats["target_logit"]).mean())
    record({"model": args.model, "task": "calibration", "nll_at_temperature": stats.pop("nll_at_temperature"),
            "slots": stats["slot_logit"].shape[1], "seconds": round(time.time() - start, 1)})
    variants = []
    first = None  # the first fitted n-gram gate: where every later fit starts
    for name in args.gates.split(","):
        use_seen, logp, count = GATES[name]
        ngram = CacheGate(len(orders), entropy=True, seen=False, logp=True, overrule=True)
        if first is not None:
            ngram.load_state_dict(first.state_dict())
        seen_gate = SeenGate(logp, count) if use_seen else None
        fitted = fit(stats, ngram, seen_gate)
        first = first or ngram
        record({"model": args.model, "task": "fit", "gate": name, "fit_nll_base": round(base, 4),
                "fit_nll_cached": round(fitted, 4)} | ngram.describe() | (seen_gate.describe() if seen_gate else {}))
        variants.append((fitted, name, SeenCachedLM(model, orders, ngram.requires_grad_(False),
                                                    seen_gate.requires_grad_(False) if seen_gate else None)))
    if args.score == "best":
        seen_fits = [v for v in variants if v[1] != "ngram"]
        variants = [v for v in variants if v[1] == "ngram"] + ([min(seen_fits, key=lambda v: v[0])] if seen_fits else [])
    tasks = args.tasks.split(",")
    for _, name, scored in variants:
        with torch.no_grad():
            score_tasks(scored, tokenizer, tasks, {"model": args.model, "variant": name}, record, [1024])

if __name__ == "__main__":
    main()
