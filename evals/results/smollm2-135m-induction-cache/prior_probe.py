"""Does the context-word cue need to know which tokens are rare, or which start a word?

Of the LAMBADA passages the teacher gets and the converted model misses (seed 4 with the
continuation term, `lambada_misses-smollm2-seed4-cont.jsonl`), most targets are names or content
words seen once, 20-60 words back, ranked 1-3 behind a common word (" the", " and") or an unseen
one. The cue raises every context token by softplus(c + d H + e log p + g log count): it cannot
tell a repeated name (bursty: seen once, likely again) from a repeated function word (seen, no
likelier for it). A cache LM's classic answer is the token's prior: this probe adds per-token
features to the cue,

    gamma_t(v) = softplus(c + d H_t + e log p_t(v) + g log count_t(v) + h log prior(v) + s [v starts a word]),

log prior(v) the token's smoothed unigram log-frequency over the run's own training streams
(phases 1 and 2: the conversion has them), starts-word from the tokenizer (decoded after a letter,
a space then a letter). It refits the product's head on the unseen fit windows (n-gram gate by Adam,
then everything by L-BFGS, as `fit_gate` does) with and without the new terms and scores the
package's evaluations with them.

Usage (repository root): python evals/results/smollm2-135m-induction-cache/prior_probe.py MODEL
                          [--variants 'prior;prior,rate'] [--tasks bits,lambada,passkey]
MODEL is a conversion's output folder with the copy cache and the context-word cue."""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hallamonic.convert import copy_cache as cc
from hallamonic.modeling.modeling_hallamonic import COPY_CACHE_LOGP_FLOOR

sys.path.insert(0, str(Path(__file__).parent))
from cache_probe import recorder, score_tasks  # noqa: E402
from fit_text_probe import fit_windows, load_run  # noqa: E402

record = recorder("prior_probe.jsonl")


def log_prior(run: Path, vocab: int) -> torch.Tensor:
    """(V,) the product's prior (`unigram_log_prior`) over the run's phase-1 and phase-2 streams."""
    return cc.unigram_log_prior([np.load(run / "training" / name) for name in ("tokens.npy", "tokens-phase2.npy")], vocab)


def starts_word(tokenizer, vocab: int) -> torch.Tensor:
    """(V,) 1 where token v, written after a letter, begins with a space and then a letter."""
    anchor = tokenizer.encode("a", add_special_tokens=False)[-1]
    width = len(tokenizer.decode([anchor]))
    table = torch.zeros(vocab)
    for token in range(min(vocab, len(tokenizer))):
        text = tokenizer.decode([anchor, token])[width:]
        table[token] = float(len(text) > 1 and text[0] == " " and text[1].isalpha())
    return table


class FeatureCue(torch.nn.Module):
    """The context-word cue with extra per-token features: (c, d, e, g) as the product's, then one
    weight per feature column of `table` (V, F), then (with `rate`) q log(tokens so far): with q = -g
    the count term reads the token's rate in the context, count / t, which does not grow with length."""

    def __init__(self, table: torch.Tensor, start: torch.Tensor, rate: bool, matched: bool = False, cap: float | None = None,
                 contra: bool = False, ngram_count: int = 0):
        super().__init__()
        self.register_buffer("table", table)  # (V, F)
        self.rate, self.matched, self.cap, self.contra = rate, matched, cap, contra
        self.matches = None  # (..., 1) per position: how many orders predict a token (set before each call)
        self.contradicted = None  # (..., S): 1 for a token an overruled order predicts (set before each call)
        self.weights = torch.nn.Parameter(torch.cat([start.float(), torch.zeros(table.shape[1] + rate + matched + contra)]))
        # ngcount: each order's gate also reads u_n log count(v_n), the copied token's count so far (a token
        # the context holds twice, as the pass key's space, vs a filler word seen 167 times)
        self.count_weights = torch.nn.Parameter(torch.zeros(ngram_count))  # (K,) or (0,)
        self.pred_counts = None  # (..., K) the predicted tokens' counts so far (set before each call)

    def __call__(self, entropy, log_p, counts, features=None):
        """As CopyCacheHead.seen_boosts; features (..., S, F) per slot, or the table's rows when S = V."""
        c, d, e, g = self.weights[:4].unbind()
        width = self.table.shape[1]
        extra = (features if features is not None else self.table) @ self.weights[4 : 4 + width]  # (..., S)
        if self.rate:  # every token so far is in a slot: the counts sum to the position + 1
            extra = extra + self.weights[4 + width] * counts.float().sum(-1, keepdim=True).clamp(min=1).log()
        if self.matched:  # an exact n-gram match says what comes; the other context words matter less
            extra = extra + self.weights[4 + width + self.rate] * self.matches
        if self.contra:  # a short order's copy that a longer order contradicts (" yellow" after "is" in passkey's filler)
            extra = extra + self.weights[-1] * self.contradicted
        x = c + d * entropy[..., None].float() + e * log_p.float().clamp(min=COPY_CACHE_LOGP_FLOOR)
        return F.softplus(x + g * counts.float().clamp(min=1, max=self.cap).log() + extra) * (counts > 0)


def ngram_boosts(head, cue: FeatureCue):
    """The product's per-order boosts (`CopyCacheHead.boosts`) with the cue's count term inside the softplus."""
    def boosts(entropy, log_p, overruled, continues=None):
        a, b, f, o = head.gate[:, :4].unbind(-1)  # (K,) each
        x = a + b * entropy[..., None].float() + f * log_p.float().clamp(min=COPY_CACHE_LOGP_FLOOR) + o * overruled.float()
        if head.gate.shape[1] > 4:
            x = x + head.gate[:, 4] * continues
        if len(cue.count_weights):
            x = x + cue.count_weights * cue.pred_counts.float().clamp(min=1).log()
        return F.softplus(x)
    return boosts


def memoize_trunk() -> None:
    """Score every variant on the same trunk outputs: the scoring's one trunk forward per batch is
    kept, keyed by its input ids (only the head and the cache differ between variants)."""
    from hallamonic.evaluation import scoring
    original, memo = scoring._final_hidden_or_logits, {}

    def cached(model, input_ids):
        key = (tuple(input_ids.shape), hash(input_ids.cpu().numpy().tobytes()))
        if key not in memo:
            memo[key] = original(model, input_ids)
        return memo[key]

    scoring._final_hidden_or_logits = cached


def slot_features(windows: torch.Tensor, table: torch.Tensor, width: int) -> torch.Tensor:
    """(P, S, F): the features of each window's distinct tokens (its slots, in the order
    `window_slots` gives them, as `_slot_statistics` lays them out), repeated over the window's scored positions."""
    rows = []
    for ids in windows:
        distinct = cc.window_slots(ids)  # (S_w,)
        feats = F.pad(table[distinct], (0, 0, 0, width - len(distinct)))  # (S, F)
        rows.append(feats[None].expand(len(ids) - 1, -1, -1))
    return torch.cat(rows)


def feature_nll(stats: dict, head, cue: FeatureCue, features: torch.Tensor) -> torch.Tensor:
    """`seen_cached_nll` with the cue's feature terms."""
    head.seen_boosts = lambda entropy, log_p, counts, *_: cue(entropy, log_p, counts, features)  # an instance attribute
    head.boosts = ngram_boosts(head, cue)
    try:
        return cc.seen_cached_nll(stats, head)
    finally:
        del head.seen_boosts, head.boosts  # the class's methods again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--variants", default="prior,start", help="feature sets separated by ';' (prior, start, rate, matched, long, capN, contra, ngcount)")
    parser.add_argument("--memo", action="store_true", help="keep the trunk's outputs between variants (memory for speed)")
    parser.add_argument("--tasks", default="bits,lambada,passkey")
    parser.add_argument("--fit-length", type=int, default=None, help="tokens per fit window (the recipe's 48 x 1,024 tokens kept: fewer, longer windows)")
    args = parser.parse_args()
    run, recipe, model, tokenizer = load_run(args.model)
    if args.memo:
        memoize_trunk()
    vocab = model.config.vocab_size
    if args.fit_length:
        total = recipe.copy_cache.fit_windows * recipe.copy_cache.fit_length
        recipe.copy_cache.fit_length, recipe.copy_cache.fit_windows = args.fit_length, total // args.fit_length
    columns = {"prior": lambda: log_prior(run, vocab), "start": lambda: starts_word(tokenizer, vocab)}
    windows = fit_windows("unseen", run, recipe, tokenizer)
    cache = recipe.copy_cache
    stats = cc.copy_cache_statistics(model, windows, progress=False)
    control, report = cc.fit_gate(stats, cache.orders, seen=True, continuation=cache.continuation, steps=cache.fit_steps, lr=cache.fit_lr)
    tag = {"fit_length": recipe.copy_cache.fit_length} if args.fit_length else {}
    record({"model": run.name, "features": [], "task": "fit"} | tag | report)  # the control: the product's own fit
    for variant in args.variants.split(";"):
        names = variant.split(",")
        tokens = [name for name in names if name in columns]
        cap = next((float(name[3:]) for name in names if name.startswith("cap")), None)  # capN: counts read at most N
        table = torch.stack([columns[name]() for name in tokens], -1) if tokens else torch.zeros(vocab, 0)  # (V, F)
        features = slot_features(windows, table, stats["slot_logit"].shape[1])
        head = copy.deepcopy(control)
        matched = "matched" in names or "long" in names
        cue = FeatureCue(table, head.seen_gate.detach(), "rate" in names, matched, cap, "contra" in names,
                         len(cache.orders) if "ngcount" in names else 0)
        cue.pred_counts = stats["slot_count"].gather(-1, stats["pred_slot"])  # (P, K)
        width = stats["slot_logit"].shape[1]
        cue.contradicted = torch.zeros(len(stats["lse"]), width).scatter_reduce(
            1, stats["pred_slot"], stats["overruled"].float(), "amax")  # (P, S)
        # matched: how many orders predict; long: whether an order >= 3 does (a confident copy)
        long_orders = torch.tensor(cache.orders) >= 3
        match_feature = (lambda valid: valid.float().sum(-1, keepdim=True)) if "matched" in names else \
            (lambda valid: (valid & long_orders.to(valid.device)).any(-1, keepdim=True).float())
        cue.matches = match_feature(stats["valid"])  # (P, 1)
        after = cc._fit_lbfgs(lambda: feature_nll(stats, head, cue, features), [head.gate, cue.weights, cue.count_weights])
        record({"model": run.name, "features": names, "task": "fit", **tag, "nll_after": round(after, 4),
                "seen_weights": [round(x, 4) for x in cue.weights.tolist()], "gate": [[round(x, 4) for x in r] for r in head.gate.tolist()]}
               | ({"count_weights": [round(x, 4) for x in cue.count_weights.tolist()]} if len(cue.count_weights) else {}))
        with torch.no_grad():
            model.copy_cache.gate.copy_(head.gate)
        cue.requires_grad_(False)
        model.copy_cache.seen_boosts = lambda entropy, log_p, counts, *_, cue=cue: cue(entropy, log_p, counts)  # the scored head uses it
        model.copy_cache.boosts = ngram_boosts(model.copy_cache, cue)
        head_forward = type(model.copy_cache).forward

        def forward(logits, predictions, counts=None, cue=cue, match_feature=match_feature):
            cue.matches = match_feature(predictions >= 0)  # (B, S, 1)
            cue.pred_counts = counts.gather(-1, predictions.clamp(min=0))  # (B, S, K)
            cue.contradicted = torch.zeros_like(logits, dtype=torch.float).scatter_reduce(
                -1, predictions.clamp(min=0), model.copy_cache.overruled(predictions).float(), "amax")  # (B, S, V)
            return head_forward(model.copy_cache, logits, predictions, counts)

        model.copy_cache.forward = forward
        score_tasks(model, tokenizer, args.tasks.split(","), {"model": run.name, "features": names} | tag, record, [1024])


if __name__ == "__main__":
    main()
