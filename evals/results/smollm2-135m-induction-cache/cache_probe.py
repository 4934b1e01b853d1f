"""An exact-match n-gram cache on top of the converted SmolLM2: does it bring the copy back?

The converted model does not copy (`../smollm2-135m-copy`): its blocks cannot make the sharp,
position-aware match the teacher's copy heads make, and no block, kernel or objective tried on
this CPU brought it back. This probe asks what the missing skill is worth, with the crudest
attention-free mechanism that has it, a cache LM in the spirit of Grave et al. (2017) and of
induction heads: for each order n, the token that followed the most recent earlier occurrence of
the current n-gram (the last n tokens) gets its logit raised by beta_n:

    logits'[t, v] = logits[t, v] + sum_n beta_n [v == next token after the last earlier match of ids[t-n+1..t]]

Recurrently this is a hash table per order (n-gram -> the token that followed it), constant in
size if hashed into a fixed number of buckets; here it is computed over whole sequences by sorting.
The betas (one per order) are fitted by cross-entropy on windows of the phase-2 training text
(`fineweb_edu_head_train.txt`, never the held-out file) with the model's logits fixed, then the
model is scored with and without the cache by the package's own evaluations (held-out bits,
LAMBADA, passkey) and the copy probe. A paraphrased passkey (the question does not repeat the
needle's words) shows what the cache cannot do.

Usage: python cache_probe.py MODEL [--orders 1,2,3,4,6,8] [--gates const,entropy,entropy-seen] [--fit-windows 48]
                              [--tasks bits,lambada,passkey,copy,paraphrase] [--no-base]
MODEL: a converted folder, or "teacher". Appends one line per (model, variant, task) to cache_probe.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from tqdm.auto import tqdm

from hallamonic.evaluation.context import evaluate_context, token_stream
from hallamonic.evaluation.data import heldout_texts
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.evaluation import passkey as passkey_task
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

HERE = Path(__file__).parent
DATA = HERE / "../../../../shared/data"
sys.path.insert(0, str(HERE.parent / "smollm2-135m-copy"))
from copy_probe import copy_scores, copy_trials, heldout_stream  # noqa: E402

HASH_MOD = 2_147_483_629  # a prime < 2^31: h * HASH_BASE stays inside int64
HASH_BASE = 1_000_003


def ngram_keys(ids: torch.Tensor, n: int) -> torch.Tensor:
    """(B, L) int64: a hash of ids[t-n+1 .. t] at each t; distinct negative keys where t < n-1."""
    keys = torch.zeros_like(ids)
    for j in range(n):  # ids shifted right by j: the token j steps back
        shifted = torch.nn.functional.pad(ids, (j, 0))[:, : ids.shape[1]]
        keys = (keys * HASH_BASE + shifted + 1) % HASH_MOD
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    return torch.where(positions >= n - 1, keys, -1 - positions)


def ngram_predictions(ids: torch.Tensor, orders: list[int]) -> torch.Tensor:
    """(B, L, K) int64: per order, the token after the most recent earlier occurrence of the n-gram
    ending at t (-1 where there is none). Position t predicts token t+1, as the logits do."""
    batch, length = ids.shape
    out = torch.full((batch, length, len(orders)), -1, dtype=torch.long)
    positions = torch.arange(length)
    for k, n in enumerate(orders):
        keys = ngram_keys(ids, n)  # (B, L)
        for row in range(batch):
            order = torch.sort(keys[row], stable=True).indices  # equal keys stay in position order
            sorted_keys = keys[row, order]
            same_as_prev = torch.zeros(length, dtype=torch.bool)
            same_as_prev[1:] = sorted_keys[1:] == sorted_keys[:-1]
            prev = torch.full((length,), -1, dtype=torch.long)
            prev[order[1:]] = torch.where(same_as_prev[1:], order[:-1], -1)  # the earlier match j < t
            has = prev >= 0
            out[row, positions[has], k] = ids[row, prev[has] + 1]  # j + 1 <= t: already seen
    return out


def ngram_history_cues(ids: torch.Tensor, orders: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, K) int64 each, per order where ngram_predictions has a token (else 0): how many times in
    a row the n-gram has been followed by that same token (1 = once, or the last time after another
    one), and how many positions back its latest occurrence ended (t - j). A plain dict per order."""
    batch, length = ids.shape
    counts = torch.zeros((batch, length, len(orders)), dtype=torch.long)
    ages = torch.zeros_like(counts)
    rows = ids.tolist()
    for b, row in enumerate(rows):
        for k, n in enumerate(orders):
            table = {}  # n-gram -> (successor, run of that successor, end position j)
            for t in range(length):
                if t >= n:  # the n-gram ending at t-1 now has its successor row[t]
                    gram = tuple(row[t - n : t])
                    old = table.get(gram)
                    run = old[1] + 1 if old is not None and old[0] == row[t] else 1
                    table[gram] = (row[t], run, t - 1)
                if t >= n - 1:
                    hit = table.get(tuple(row[t - n + 1 : t + 1]))
                    if hit is not None:
                        counts[b, t, k], ages[b, t, k] = hit[1], t - hit[2]
    return counts, ages


def overruled(preds: torch.Tensor) -> torch.Tensor:
    """(..., K) bool: a longer order matched and points at a different token than this order's."""
    out = torch.zeros_like(preds, dtype=torch.bool)
    for k in range(preds.shape[-1] - 1):
        longer = preds[..., k + 1 :]
        out[..., k] = ((longer >= 0) & (longer != preds[..., k : k + 1])).any(-1) & (preds[..., k] >= 0)
    return out


def exclude_overruled(preds: torch.Tensor) -> torch.Tensor:
    """(..., K) predictions with each order's dropped (-1) where a longer order matched and points at
    a different token (backoff as in PPM: the longest context that matched decides)."""
    return torch.where(overruled(preds), -1, preds)


def hit_streaks(ids: torch.Tensor, preds: torch.Tensor) -> torch.Tensor:
    """(B, L, K) int64: per order, for how many consecutive positions before t its prediction was
    right (the copy has been running that long): a match's length beyond the order itself."""
    length = ids.shape[1]
    hit = torch.zeros_like(preds, dtype=torch.bool)
    hit[:, :-1] = (preds[:, :-1] == ids[:, 1:, None]) & (preds[:, :-1] >= 0)  # position s predicted s+1
    positions = torch.arange(length)[None, :, None].expand_as(preds)
    last_miss = torch.where(hit, -1, positions).cummax(1).values  # (B, L, K): latest miss at or before s
    missed_before = torch.nn.functional.pad(last_miss, (0, 0, 1, 0), value=-1)[:, :length]  # latest miss before t
    return positions - 1 - missed_before


def seen_mask(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, L, V) bool: token v occurs in ids[.., :t+1] (every n-gram prediction is such a token)."""
    batch, length = ids.shape
    first = torch.full((batch, vocab), length, dtype=torch.long, device=ids.device)
    positions = torch.arange(length, device=ids.device).expand_as(ids)
    first.scatter_reduce_(1, ids, positions, reduce="amin")  # (B, V): first position of each token
    return first[:, None, :] <= torch.arange(length, device=ids.device)[None, :, None]


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits, -1)
    return -(log_p.exp() * log_p).sum(-1)


class CacheGate(nn.Module):
    """How much each cue raises a logit, as a function of the model's own entropy H_t (nats):
    beta_n(t) = softplus(a_n + b_n H_t) for the order-n match's token, and, with `seen`,
    gamma(t) = softplus(c + d H_t) for every token already in the context (a unigram cache).
    Without `entropy` the slopes b_n, d stay 0: one constant per cue. With `streak`, beta_n also
    reads e_n log(1 + r_n(t)), r_n the order's run of right predictions just before t; with
    `logp`, f_n log p_t(v_n), the model's own log-probability of the order's token; with `count`,
    g_n log c_n, c_n how many times in a row the n-gram was followed by v_n; with `age`,
    h_n log d_n, d_n how far back the n-gram's latest occurrence is; with `overrule`, o_n [a longer
    order matched another token] (a soft PPM backoff: o_n -> -inf drops the overruled token)."""

    def __init__(self, orders: int, entropy: bool, seen: bool, streak: bool = False, logp: bool = False,
                 backoff: bool = False, count: bool = False, age: bool = False, overrule: bool = False):
        super().__init__()
        self.entropy, self.seen, self.streak, self.logp, self.backoff = entropy, seen, streak, logp, backoff
        self.count, self.age, self.overrule = count, age, overrule
        self.overrule_weights = nn.Parameter(torch.zeros(orders))  # (K,): o_n
        self.count_weights = nn.Parameter(torch.zeros(orders))  # (K,): g_n
        self.age_weights = nn.Parameter(torch.zeros(orders))  # (K,): h_n
        self.logp_weights = nn.Parameter(torch.zeros(orders))  # (K,): f_n
        self.order_weights = nn.Parameter(torch.tensor([[-2.0, 0.0]] * orders))  # (K, 2): a_n, b_n
        self.streak_weights = nn.Parameter(torch.zeros(orders))  # (K,): e_n
        self.seen_weights = nn.Parameter(torch.tensor([[-4.0, 0.0]]))  # (1, 2): c, d

    def _gate(self, weights: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        slope = weights[:, 1] if self.entropy else torch.zeros_like(weights[:, 1])
        return nn.functional.softplus(weights[:, 0] + slope * entropy[..., None])  # (..., rows)

    def betas(self, entropy: torch.Tensor, streaks: torch.Tensor | None = None, logp: torch.Tensor | None = None,
              counts: torch.Tensor | None = None, ages: torch.Tensor | None = None,
              overruled_by: torch.Tensor | None = None) -> torch.Tensor:
        """(..., K) per-order boosts at positions with entropy (...), runs (..., K), the predicted
        tokens' log-probabilities (..., K), their repeat counts and ages (..., K)."""
        if not (self.streak or self.logp or self.count or self.age or self.overrule):
            return self._gate(self.order_weights, entropy)
        slope = self.order_weights[:, 1] if self.entropy else torch.zeros_like(self.order_weights[:, 1])
        x = self.order_weights[:, 0] + slope * entropy[..., None]  # (..., K)
        if self.streak:
            x = x + self.streak_weights * torch.log1p(streaks.float())
        if self.logp:
            x = x + self.logp_weights * logp.clamp(min=-30)
        if self.count:
            x = x + self.count_weights * counts.clamp(min=1).float().log()
        if self.age:
            x = x + self.age_weights * ages.clamp(min=1).float().log()
        if self.overrule:
            x = x + self.overrule_weights * overruled_by.float()
        return nn.functional.softplus(x)

    def gamma(self, entropy: torch.Tensor) -> torch.Tensor:
        """(...) the boost of every seen token (0 without `seen`)."""
        return self._gate(self.seen_weights, entropy)[..., 0] if self.seen else torch.zeros_like(entropy)

    def describe(self) -> dict:
        rows = {"orders_a_b": [[round(x, 3) for x in row] for row in self.order_weights.tolist()]}
        if self.logp:
            rows["logp_f"] = [round(x, 3) for x in self.logp_weights.tolist()]
        if self.count:
            rows["count_g"] = [round(x, 3) for x in self.count_weights.tolist()]
        if self.overrule:
            rows["overrule_o"] = [round(x, 3) for x in self.overrule_weights.tolist()]
        if self.age:
            rows["age_h"] = [round(x, 3) for x in self.age_weights.tolist()]
        if self.streak:
            rows["streak_e"] = [round(x, 3) for x in self.streak_weights.tolist()]
        if self.seen:
            rows["seen_c_d"] = [round(x, 3) for x in self.seen_weights[0].tolist()]
        return rows


class CachedLM(nn.Module):
    """The wrapped causal LM with the cache's boosts added to its logits."""

    def __init__(self, model: nn.Module, orders: list[int], gate: CacheGate):
        super().__init__()
        self.model, self.orders, self.gate, self.config = model, orders, gate, model.config

    def forward(self, input_ids: torch.Tensor, **kwargs) -> SimpleNamespace:
        logits = self.model(input_ids=input_ids, **kwargs).logits.float()  # (B, L, V)
        entropy = entropy_of(logits)  # (B, L)
        preds = ngram_predictions(input_ids.cpu(), self.orders).to(logits.device)  # (B, L, K)
        if self.gate.backoff:
            preds = exclude_overruled(preds)
        streaks = hit_streaks(input_ids.cpu(), preds.cpu()).to(logits.device)
        logp = torch.log_softmax(logits, -1).gather(-1, preds.clamp(min=0))  # (B, L, K)
        counts, ages = (ngram_history_cues(input_ids.cpu(), self.orders) if self.gate.count or self.gate.age
                        else (torch.ones_like(preds.cpu()),) * 2)
        boost = self.gate.betas(entropy, streaks, logp, counts.to(logits.device), ages.to(logits.device),
                                overruled(preds)) * (preds >= 0)
        logits = logits.scatter_add(-1, preds.clamp(min=0), boost)
        if self.gate.seen:
            logits = logits + self.gate.gamma(entropy)[..., None] * seen_mask(input_ids, logits.shape[-1])
        return SimpleNamespace(logits=logits)


@torch.no_grad()
def fit_statistics(model, windows: list[list[int]], orders: list[int], backoff: bool = False) -> dict:
    """Per scored position: logsumexp, entropy, target logit, the K predicted tokens' logits, which
    of them are present / equal to each other / equal to the target, the probability mass on
    tokens already seen and whether the target is one (all the fit needs)."""
    keys = ("lse", "entropy", "target", "pred_logit", "valid", "same", "hit", "p_seen", "target_seen", "streak", "count", "age", "overruled")
    parts = {key: [] for key in keys}
    for window in tqdm(windows, desc="fit windows", unit="window"):
        ids = torch.tensor([window])  # (1, L)
        logits = model(input_ids=ids, use_cache=False).logits.float()[0, :-1]  # (L-1, V)
        all_preds = ngram_predictions(ids, orders)  # (1, L, K)
        if backoff:
            all_preds = exclude_overruled(all_preds)
        parts["streak"].append(hit_streaks(ids, all_preds)[0, :-1])
        counts, ages = ngram_history_cues(ids, orders)
        if not backoff:
            assert torch.equal((counts > 0), (all_preds >= 0)), "history cues disagree with the predictions"
        parts["count"].append(counts[0, :-1])
        parts["age"].append(ages[0, :-1])
        parts["overruled"].append(overruled(all_preds)[0, :-1])
        preds = all_preds[0, :-1]  # (L-1, K)
        seen = seen_mask(ids, logits.shape[-1])[0, :-1]  # (L-1, V)
        target = ids[0, 1:]  # (L-1,)
        valid = preds >= 0
        parts["lse"].append(torch.logsumexp(logits, -1))
        parts["entropy"].append(entropy_of(logits))
        parts["target"].append(logits.gather(-1, target[:, None])[:, 0])
        parts["pred_logit"].append(logits.gather(-1, preds.clamp(min=0)))
        parts["valid"].append(valid)
        parts["same"].append((preds[:, :, None] == preds[:, None, :]) & valid[:, :, None] & valid[:, None, :])
        parts["hit"].append((preds == target[:, None]) & valid)
        parts["p_seen"].append((torch.softmax(logits, -1) * seen).sum(-1))
        parts["target_seen"].append(seen.gather(-1, target[:, None])[:, 0])
    return {key: torch.cat(value) for key, value in parts.items()}


def cached_nll(stats: dict, gate: CacheGate) -> torch.Tensor:
    """Mean NLL (nats) of the cached model on the fit positions, differentiable in the gate."""
    betas = gate.betas(stats["entropy"], stats["streak"], stats["pred_logit"] - stats["lse"][:, None],
                       stats["count"], stats["age"], stats["overruled"])  # (P, K)
    gamma = gate.gamma(stats["entropy"])  # (P,)
    same = stats["same"].float()  # (P, K, K)
    boost = (same @ betas[:, :, None])[..., 0]  # (P, K): orders that agree on a token add up
    weight = stats["valid"].float() / same.sum(-1).clamp(min=1)  # count each distinct token once
    p_pred = (stats["pred_logit"] - stats["lse"][:, None]).exp()  # (P, K)
    # a predicted token was seen, so it carries gamma too: its extra mass is p e^gamma (e^B - 1)
    extra = gamma.expm1() * stats["p_seen"] + gamma.exp() * (weight * p_pred * boost.expm1()).sum(-1)
    lse = stats["lse"] + torch.log1p(extra)
    target = stats["target"] + gamma * stats["target_seen"].float() + (stats["hit"].float() * betas).sum(-1)
    return (lse - target).mean()


def fit_gate(stats: dict, gate: CacheGate, steps: int = 400) -> float:
    """Fit the gate by Adam on the statistics; returns the fitted mean NLL."""
    opt = torch.optim.Adam(gate.parameters(), lr=0.05)
    for _ in range(steps):
        loss = cached_nll(stats, gate)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float(cached_nll(stats, gate))


GATES = {  # name -> (entropy slopes, unigram "seen" cue)
    "const": (False, False),
    "entropy": (True, False),
    "entropy-seen": (True, True),
    "entropy-streak": (True, False, True),
    "entropy-logp": (True, False, False, True),
    "entropy-streak-logp": (True, False, True, True),
    "entropy-logp-backoff": (True, False, False, True, True),
    "entropy-logp-count": (True, False, False, True, False, True),
    "entropy-logp-age": (True, False, False, True, False, False, True),
    "entropy-logp-count-age": (True, False, False, True, False, True, True),
    "entropy-logp-overrule": (True, False, False, True, False, False, False, True),
}


PARAPHRASE_QUESTION = " Which number was hidden in the text above? The number was"


def paraphrased_passkey(model, tokenizer, lengths: list[int], trials: int) -> dict:
    """The passkey task with a question that does not repeat the needle's words."""
    original = passkey_task.QUESTION
    passkey_task.QUESTION = PARAPHRASE_QUESTION
    try:
        return passkey_task.evaluate_passkey(model, tokenizer, lengths, trials=trials, progress=False)
    finally:
        passkey_task.QUESTION = original


def score_tasks(scored, tokenizer, tasks: list[str], row: dict, record, bit_lengths: list[int]) -> None:
    """The package's own evaluations of a (cached) model, each recorded as row + its result: held-out
    bits at bit_lengths, LAMBADA (first 300 passages), passkey (10 trials at 1K / 2K / 4K)."""
    if "bits" in tasks:
        start = time.time()
        result = evaluate_context(scored, tokenizer, heldout_texts(DATA / "fineweb_edu_head_heldout.txt", 0), bit_lengths, progress=False)
        record(row | {"task": "bits", "bits": result["bits_per_token"], "seconds": round(time.time() - start, 1)})
    if "lambada" in tasks:
        start = time.time()
        lines = (DATA / "lambada_openai_dev1000.jsonl").read_text().splitlines()[:300]
        result = evaluate_lambada(scored, tokenizer, [json.loads(line)["text"] for line in lines], progress=False)
        record(row | {"task": "lambada", "accuracy": round(result["accuracy"], 4), "perplexity": round(result["perplexity"], 1),
                      "correct": result["correct"], "seconds": round(time.time() - start, 1)})
    if "passkey" in tasks:
        start = time.time()
        result = passkey_task.evaluate_passkey(scored, tokenizer, [1024, 2048, 4096], trials=10, progress=False)
        record(row | {"task": "passkey", "accuracy": result["accuracy"], "key_tokens": result["key_tokens"],
                      "seconds": round(time.time() - start, 1)})


def recorder(name: str):
    """A function that prints a result row and appends it to HERE / name (JSON lines)."""
    def record(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with open(HERE / name, "a") as f:
            f.write(json.dumps(row) + "\n")
    return record


record = recorder("cache_probe.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--orders", default="1,2,3,4,6,8")
    parser.add_argument("--fit-windows", type=int, default=48)
    parser.add_argument("--fit-length", type=int, default=1024)
    parser.add_argument("--tasks", default="bits,lambada,passkey,copy,paraphrase")
    parser.add_argument("--gates", default="const", help=f"comma list of {sorted(GATES)}")
    parser.add_argument("--no-base", action="store_true", help="score only the cached model(s)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    orders = [int(n) for n in args.orders.split(",")]
    model, tokenizer = load_causal_lm(str(smollm2_gguf_path()) if args.model == "teacher" else args.model)[:2]
    model.eval()
    if getattr(model, "copy_cache", None) is not None:  # a conversion's own cache: the probe brings its own
        model.copy_cache = None

    start = time.time()
    train = (DATA / "fineweb_edu_head_train.txt").read_text().split("\n\n")
    random.Random(0).shuffle(train)
    stream = token_stream(tokenizer, train[:2000])
    body = args.fit_length
    windows = [stream[i * body : (i + 1) * body] for i in range(args.fit_windows)]
    stats_by_backoff = {}
    variants = [] if args.no_base else [("base", model)]
    for name in args.gates.split(","):
        gate = CacheGate(len(orders), *GATES[name])
        if gate.backoff not in stats_by_backoff:
            stats_by_backoff[gate.backoff] = fit_statistics(model, windows, orders, backoff=gate.backoff)
        stats = stats_by_backoff[gate.backoff]
        base_nll = float((stats["lse"] - stats["target"]).mean())
        fitted = fit_gate(stats, gate)
        record({"model": args.model, "task": "fit", "gate": name, "orders": orders} | gate.describe()
               | {"fit_nll_base": round(base_nll, 4), "fit_nll_cached": round(fitted, 4),
                  "fit_tokens": len(stats["lse"]), "seconds": round(time.time() - start, 1)})
        variants.append((name, CachedLM(model, orders, gate.requires_grad_(False))))
    tasks = args.tasks.split(",")
    for name, scored in variants:
        row = {"model": args.model, "variant": name, "orders": orders}
        with torch.no_grad():
            score_tasks(scored, tokenizer, tasks, row, record, [1024, 4096])
            if "paraphrase" in tasks:
                start = time.time()
                result = paraphrased_passkey(scored, tokenizer, [1024], trials=10)
                record(row | {"task": "passkey-paraphrased", "accuracy": result["accuracy"],
                              "key_tokens": result["key_tokens"], "seconds": round(time.time() - start, 1)})
            if "copy" in tasks:
                copy_stream = heldout_stream(tokenizer)
                for gap in (0, 256, 768):
                    record(row | {"task": "copy", "gap": gap} | copy_scores(scored, copy_trials(copy_stream, gap, 16)))

if __name__ == "__main__":
    main()
