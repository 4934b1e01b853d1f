"""Give a converted model the copy cache and fit its gate (the conversion's last step).

The converted blocks do not copy: a span of text seen before is predicted no better the second
time (evals/results/smollm2-135m-copy). The copy cache (``hallamonic_copy_cache.py``) recalls,
for each n-gram order, the token that followed the last earlier occurrence of the current n
tokens; :class:`CopyCacheHead` raises its logit by softplus(a_n + b_n H_t + f_n log p_t(v_n) + o_n
[overruled]), H_t the model's own entropy, p_t(v_n) its own probability of that token and the last
term on when a longer order predicts another token. Only those 4 x orders numbers (5 with the continuation term below) are fitted, by cross-entropy on training text with the model's logits fixed, so the fit
needs one forward over the windows and then seconds: per scored position it keeps the logsumexp,
the entropy, the target's logit and the predicted tokens' logits, from which the cached model's
loss follows exactly for any gate (``cached_nll``).

With the context-word cue (``seen``: every token already in the window raised by softplus(c + d
H_t + e log p_t(v) + g log count_t(v))) the fit needs more, but still only the window's own
tokens: every token either cue raises occurs in the window, so per position the logits of the
window's distinct tokens (a few hundred "slots"), their counts so far, and the log-sum-exp over all
other tokens give the loss exactly (``seen_cached_nll``). The n-gram gate is fitted first as
without it, then both together by L-BFGS (5 x orders + up to 6 numbers) on a twin of that loss
that reads each position's seen slots only (``slot_terms``, ``fast_seen_cached_nll``): on the
recipe's 12 x 4,096-token windows the statistics took ~2.7 min and the fit ~36 s on a 2-core CPU
with AVX-512 BF16 (``benchmarks/copy_cache_fit.py`` times both on a finished run).

With the word-continuation term (``continuation``: a fifth gate column per order, + w_n when the
copied token continues a word) the statistics also keep, per prediction, whether its token does
(a table over the vocabulary from the tokenizer, ``word_continuation_table``); the fit is the same.

With the prior (``prior``: the context-word cue also reads h log prior(v), the token's log unigram
frequency in the conversion's own training streams, ``unigram_log_prior``) the slot statistics also
keep each slot's log prior. With the rate (``rate``: + q log t) or the count cap (``count_cap``)
nothing more: t is the sum of a position's slot counts, the cap applies to them.

Attached after phase 2, not before: a cache present while the blocks train would cost every
phase-2 step a full-vocabulary entropy, and its gate starts closed anyway.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hallamonic.modeling.modeling_hallamonic import COPY_CACHE_LOGP_FLOOR, CopyCacheHead, HallamonicForCausalLM


# The fit starts every order at a boost of softplus(-2) = 0.13 nats, not at the closed gate the
# model is built with: there softplus's slope is 5e-5 and the fit stopped short (SmolLM2, the recipe's 48 windows:
# 3.2410 nats/token from the closed gate, 3.2393 from here, long orders then open where the model is sure).
FIT_START = (-2.0, 0.0, 0.0, 0.0, 0.0)  # a_n, b_n, f_n, o_n (and w_n with the continuation term)
SEEN_FIT_START = (-4.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # the context-word cue's start: softplus(-4) = 0.018 nats (c, d, e, g[, h][, q])


def _fit_lbfgs(loss_fn, params, iterations: int = 60) -> float:
    """Minimise loss_fn() over params by L-BFGS; returns the final loss. On the few gate numbers
    60 iterations reach what 1,000 Adam steps do (seen_probe.py)."""
    params = list(params)
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=iterations, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        return float(loss_fn())


def word_continuation_table(tokenizer, vocab_size: int) -> torch.Tensor:
    """(V,) bool: token v, written right after a letter, starts with a letter (no space, digit or
    punctuation first): it continues the word before it. Digits are left out: the digit after a digit
    is a number's, and an earlier number says little about it (the passkey's digits, copied by
    longer orders, are not helped by trusting order 1 more). Decoding each token after a fixed letter
    works for byte-level BPE and SentencePiece alike (SentencePiece drops a lone token's leading
    space, so decoding v alone would not tell). Ids past the tokenizer's length stay False."""
    anchor = tokenizer.encode("a", add_special_tokens=False)[-1]
    width = len(tokenizer.decode([anchor]))
    table = torch.zeros(vocab_size, dtype=torch.bool)
    for token in range(min(vocab_size, len(tokenizer))):
        text = tokenizer.decode([anchor, token])[width:]
        table[token] = bool(text) and text[0].isalpha()
    return table


def unigram_log_prior(streams: list, vocab_size: int) -> torch.Tensor:
    """(V,) float: log unigram frequency of each token id over the token streams (1-D arrays or
    tensors), add-0.5 smoothed so an id never seen gets a finite, lowest value. Why a prior from the
    run's own training text: it is at hand (the phases' streams), in the base model's vocabulary,
    and ~460K tokens rank the tokens a context can repeat well enough (prior_probe.py)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for stream in streams:
        ids = torch.as_tensor(stream).long().flatten()
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"unigram_log_prior: token ids must lie in [0, {vocab_size}), got {int(ids.min())}..{int(ids.max())}")
        counts += torch.bincount(ids, minlength=vocab_size).double()
    if counts.sum() == 0:
        raise ValueError("unigram_log_prior: the streams hold no tokens")
    return ((counts + 0.5) / (counts.sum() + 0.5 * vocab_size)).log().float()


def attach_copy_cache(
    model: HallamonicForCausalLM, orders: list[int], buckets: int, seen: bool = False,
    continues_word: torch.Tensor | None = None, log_prior: torch.Tensor | None = None, rate: bool = False, count_cap: int = 0,
) -> CopyCacheHead:
    """Add a closed copy cache (gate at its init; with ``seen``, the context-word cue too; with
    ``continues_word`` (V,) bool, the word-continuation term; with ``log_prior`` (V,), the cue's
    prior term; with ``rate``, its q log t term; with ``count_cap`` > 0, counts read up to that cap) to
    `model` and record it in the config."""
    model.config.copy_cache_orders, model.config.copy_cache_buckets = list(orders), buckets
    model.config.copy_cache_seen = seen
    model.config.copy_cache_continuation = continues_word is not None
    model.config.copy_cache_prior = log_prior is not None
    model.config.copy_cache_rate, model.config.copy_cache_count_cap = rate, count_cap
    model.config._validate_hallamonic()
    device = model.lm_head.weight.device
    vocab = model.config.vocab_size
    tables = {"continues_word": continues_word, "log_prior": log_prior}
    for name, table in tables.items():
        if table is not None and table.shape != (vocab,):
            raise ValueError(f"attach_copy_cache: `{name}` must have one entry per vocabulary id ({vocab}), got {tuple(table.shape)}")
    model.copy_cache = CopyCacheHead(
        list(orders), seen, vocab if continues_word is not None else None, vocab if log_prior is not None else None, rate,
        count_cap,
    ).to(device)
    for name, table in tables.items():
        if table is not None:
            getattr(model.copy_cache, name).copy_(table.to(device))
    return model.copy_cache


@torch.no_grad()
def copy_cache_statistics(model: HallamonicForCausalLM, windows: torch.Tensor, progress: bool = True) -> dict:
    """What the gate's fit needs, per scored position of windows (W, L): the model's logits
    without the cache reduced to logsumexp, entropy, target logit and the K predicted tokens'
    logits, which predictions exist, agree with each other, are overruled by a longer order, hit
    the target and (with the continuation term) continue a word."""
    keys = ("lse", "entropy", "target", "pred_logit", "valid", "same", "overruled", "hit", "continues")
    slot_keys = ("slot_logit", "slot_count", "slot_prior", "lse_unseen", "pred_slot", "target_slot")
    seen = model.copy_cache.seen_gate is not None
    continuation = model.copy_cache.continues_word is not None
    prior = model.copy_cache.log_prior if seen else None
    parts: dict[str, list[torch.Tensor]] = {key: [] for key in keys + (slot_keys if seen else ())}
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
        if continuation:
            parts["continues"].append(model.copy_cache.continuation(preds))  # (L-1, K)
        if seen:
            _slot_statistics(parts, logits, ids[0], preds, prior)
    stats = {key: torch.cat(value).cpu() for key, value in parts.items() if value and not key.startswith("slot_")}
    if seen:  # windows hold different numbers of distinct tokens: pad the slots
        width = max(part.shape[1] for part in parts["slot_logit"])
        pad = lambda part, value: torch.nn.functional.pad(part, (0, width - part.shape[1]), value=value)  # noqa: E731
        stats["slot_logit"] = torch.cat([pad(part, float("-inf")) for part in parts["slot_logit"]]).cpu()
        stats["slot_count"] = torch.cat([pad(part, 0.0) for part in parts["slot_count"]]).cpu()
        if parts["slot_prior"]:
            stats["slot_prior"] = torch.cat([pad(part, 0.0) for part in parts["slot_prior"]]).cpu()
    return stats


def window_slots(ids: torch.Tensor) -> torch.Tensor:
    """(S,) a window's distinct tokens (L,), in the order they first occur: its slots. Why that order:
    at any position the tokens seen so far are then a prefix of the slots, so the fit's loss can
    skip the rest (``slot_terms``)."""
    distinct, inverse = torch.unique(ids, return_inverse=True)  # (S,), (L,)
    first = torch.full_like(distinct, len(ids)).scatter_reduce(0, inverse, torch.arange(len(ids), device=ids.device), "amin")
    return distinct[first.argsort()]


def _slot_statistics(
    parts: dict, logits: torch.Tensor, ids: torch.Tensor, preds: torch.Tensor, prior: torch.Tensor | None = None
) -> None:
    """Append one window's slot statistics: logits (L-1, V), ids (L,), predictions (L-1, K), the (V,)
    log prior if any. Slots are the window's distinct tokens (``window_slots``), the only ones a cue
    can raise; their counts up to each position are those ``context_counts`` gives the model, taken
    over the slots alone ((L-1, S) instead of (L-1, V))."""
    distinct = window_slots(ids)  # (S,)
    if prior is not None:
        parts["slot_prior"].append(prior[distinct].float()[None].expand(len(ids) - 1, -1))  # (L-1, S)
    slot_of = torch.full((logits.shape[-1],), -1, dtype=torch.long, device=ids.device)
    slot_of[distinct] = torch.arange(len(distinct), device=ids.device)
    target = ids[1:]  # (L-1,)
    counts = F.one_hot(slot_of[ids[:-1]], len(distinct)).float().cumsum(0)  # (L-1, S): occurrences up to and including t
    slot_logit = logits[:, distinct]  # (L-1, S)
    unseen_logits = logits.scatter(-1, distinct.expand(len(target), -1), torch.where(counts > 0, float("-inf"), slot_logit))
    parts["slot_logit"].append(slot_logit)
    parts["slot_count"].append(counts)
    parts["lse_unseen"].append(torch.logsumexp(unseen_logits, -1))  # (L-1,)
    parts["pred_slot"].append(torch.where(preds >= 0, slot_of[preds.clamp(min=0)], 0))  # (L-1, K)
    target_slot = slot_of[target]  # (L-1,): every target is one of the window's tokens
    parts["target_slot"].append(torch.where(counts.gather(-1, target_slot[:, None])[:, 0] > 0, target_slot, -1))  # -1: not seen yet


def cached_nll(stats: dict, head: CopyCacheHead) -> torch.Tensor:
    """Mean next-token NLL (nats) of the model with `head` on the statistics' positions; exact
    (equal to scoring the cached model's logits), differentiable in the gate."""
    log_p = stats["pred_logit"] - stats["lse"][:, None]  # (P, K): the model's log p of each predicted token
    boosts = head.boosts(stats["entropy"], log_p, stats["overruled"], stats.get("continues")) * stats["valid"]  # (P, K)
    same = stats["same"].float()  # (P, K, K)
    total = (same @ boosts[:, :, None])[..., 0]  # (P, K): each predicted token's boost, agreeing orders summed
    once = stats["valid"].float() / same.sum(-1).clamp(min=1)  # a token several orders predict counts once
    lse = stats["lse"] + torch.log1p((once * log_p.exp() * total.expm1()).sum(-1))
    target = stats["target"] + (stats["hit"].float() * boosts).sum(-1)
    return (lse - target).mean()


def seen_cached_nll(stats: dict, head: CopyCacheHead) -> torch.Tensor:
    """Mean next-token NLL (nats) of the model with `head`, context-word cue included, from the
    slot statistics; exact, differentiable in both gates."""
    log_p = stats["slot_logit"] - stats["lse"][:, None]  # (P, S)
    boosts = head.boosts(stats["entropy"], log_p.gather(-1, stats["pred_slot"]), stats["overruled"], stats.get("continues"))
    boosts = boosts * stats["valid"]
    z = stats["slot_logit"].scatter_add(-1, stats["pred_slot"], boosts)  # (P, S): agreeing orders add up
    z = z + head.seen_boosts(stats["entropy"], log_p, stats["slot_count"], stats.get("slot_prior"))
    active = stats["slot_count"] > 0  # seen so far
    lse = torch.logaddexp(stats["lse_unseen"], torch.logsumexp(z.masked_fill(~active, float("-inf")), -1))
    slot = stats["target_slot"]
    target = torch.where(slot >= 0, z.gather(-1, slot.clamp(min=0)[:, None])[:, 0], stats["target"])
    return (lse - target).mean()


def slot_terms(stats: dict, head: CopyCacheHead, chunks: int = 16) -> list[dict]:
    """What the L-BFGS fit's ~70 loss evaluations read, computed once: per position the n-gram
    gate's inputs and, over the slots, what no gate changes (clamped log p, capped log counts, the
    prior, log t, which slots are unseen). On 12 x 4,096-token windows (~1,700 slots) one evaluation
    over every slot costs ~2 s here; two savings halve it. Positions are sorted by how many slots
    they have seen and cut into ``chunks`` groups, each keeping only the slots up to its last seen
    one: with slots in first-occurrence order (``window_slots``) a position early in a window has
    seen few (~0.5 of the (P, S) entries are kept on the recipe's windows). The loss is a mean over
    positions, so their order does not matter."""
    counts = stats["slot_count"]  # (P, S)
    slot_index = torch.arange(1, counts.shape[1] + 1)  # (S,)
    needed = ((counts > 0) * slot_index).amax(-1)  # (P,): slots up to the last seen one
    needed = torch.maximum(needed, torch.maximum(stats["pred_slot"].amax(-1), stats["target_slot"]) + 1)
    cap = head.count_cap or None
    groups = []
    for rows in needed.argsort().chunk(chunks):
        width = int(needed[rows].max())
        count = counts[rows, :width]  # (R, W)
        log_p = stats["slot_logit"][rows, :width] - stats["lse"][rows, None]  # (R, W)
        columns = [log_p.clamp(min=COPY_CACHE_LOGP_FLOOR), count.clamp(min=1, max=cap).log()]
        if head.log_prior is not None:
            columns.append(stats["slot_prior"][rows, :width])
        group = {key: stats[key][rows] for key in ("entropy", "overruled", "valid", "pred_slot", "lse_unseen", "target_slot", "target")}
        group |= {
            "continues": stats["continues"][rows] if "continues" in stats else None,
            "slot_logit": stats["slot_logit"][rows, :width],  # (R, W)
            "pred_log_p": log_p.gather(-1, group["pred_slot"]),  # (R, K)
            "features": torch.stack(columns, -1),  # (R, W, 2 or 3): what e, g (and h) multiply
            "unseen": count == 0,  # (R, W)
            "log_t": counts[rows].sum(-1).clamp(min=1).log() if head.rate else None,  # (R,)
        }
        groups.append(group)
    return groups


def fast_seen_cached_nll(terms: list[dict], head: CopyCacheHead) -> torch.Tensor:
    """``seen_cached_nll`` from precomputed ``slot_terms``: the same loss (a test holds them equal)
    in about a third of the passes over about half the slots. Its reference twin is
    ``seen_cached_nll``, which goes through the head's own ``boosts`` / ``seen_boosts``, the model's
    formulas."""
    total, positions = 0.0, 0
    for group in terms:
        boosts = head.boosts(group["entropy"], group["pred_log_p"], group["overruled"], group["continues"]) * group["valid"]
        c, d = head.seen_gate[:2].unbind()
        base = c + d * group["entropy"].float()  # (R,)
        if group["log_t"] is not None:
            base = base + head.seen_gate[-1] * group["log_t"]
        width = group["features"].shape[-1]  # e, g (and h) sit at 2, 3 (and 4)
        x = base[:, None] + group["features"] @ head.seen_gate[2 : 2 + width]  # (R, W): one pass, and one for the gradient
        z = group["slot_logit"].scatter_add(-1, group["pred_slot"], boosts) + F.softplus(x)  # (R, W); unseen slots masked below
        lse = torch.logaddexp(group["lse_unseen"], torch.logsumexp(z.masked_fill(group["unseen"], float("-inf")), -1))
        slot = group["target_slot"]  # a target in a slot has been seen: its slot is never masked
        target = torch.where(slot >= 0, z.gather(-1, slot.clamp(min=0)[:, None])[:, 0], group["target"])
        total = total + (lse - target).sum()
        positions += len(slot)
    return total / positions


def fit_gate(
    stats: dict, orders: list[int], *, seen: bool, continuation: bool, prior: bool = False, rate: bool = False,
    count_cap: int = 0, steps: int = 400, lr: float = 0.05,
) -> tuple[CopyCacheHead, dict]:
    """Fit a fresh head's gates on `stats` (``copy_cache_statistics``): the n-gram gate by Adam from
    FIT_START, then with the context-word cue both by L-BFGS. ``continuation`` needs the statistics'
    "continues", ``prior`` their "slot_prior". Returns the head (its tables left empty: only its gates
    are the fit's) and a report. ``rate`` and ``count_cap`` need nothing more (t is the sum of a
    position's slot counts; the cap applies to them)."""
    if continuation and "continues" not in stats:
        raise ValueError("fit_gate: the continuation term needs statistics taken with the word-continuation table")
    if prior and not (seen and "slot_prior" in stats):
        raise ValueError("fit_gate: the prior term needs the context-word cue and statistics taken with the prior table")
    if (rate or count_cap) and not seen:
        raise ValueError("fit_gate: the rate and the count cap are the context-word cue's; they need seen=True")
    head = CopyCacheHead(orders, seen, 1 if continuation else None, 1 if prior else None, rate, count_cap)  # placeholder tables: the stats hold them
    unused = {key for key, used in (("continues", continuation), ("slot_prior", prior)) if not used}
    stats = {key: value for key, value in stats.items() if key not in unused}
    with torch.no_grad():
        head.gate.copy_(torch.tensor([FIT_START[: head.gate.shape[1]]] * len(orders)))
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(steps):
        loss = cached_nll(stats, head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = float(cached_nll(stats, head))
    report = {}
    if seen:  # the context-word cue, with the n-gram gate, from where that stopped
        ngram_only = after
        with torch.no_grad():
            head.seen_gate.copy_(torch.tensor(SEEN_FIT_START[: head.seen_gate.shape[0]]))
        terms = slot_terms(stats, head)
        _fit_lbfgs(lambda: fast_seen_cached_nll(terms, head), head.parameters())
        with torch.no_grad():
            after = float(seen_cached_nll(stats, head))  # the reported loss: the reference twin's
        report = {"seen_gate": [round(x, 4) for x in head.seen_gate.tolist()], "nll_ngram_only": round(ngram_only, 4)}  # c, d, e, g[, h][, q]
    return head, report | {
        "gate": [[round(x, 4) for x in row] for row in head.gate.tolist()],  # per order: a_n, b_n, f_n, o_n (, w_n)
        "nll_before": round(float((stats["lse"] - stats["target"]).mean()), 4),
        "nll_after": round(after, 4),
    }


def gate_terms(head: CopyCacheHead) -> dict:
    """Which gate terms ``head`` carries, as :func:`fit_gate`'s keyword arguments."""
    return {
        "seen": head.seen_gate is not None, "continuation": head.continues_word is not None,
        "prior": head.log_prior is not None, "rate": head.rate, "count_cap": head.count_cap,
    }


def fit_copy_cache(
    model: HallamonicForCausalLM, windows: torch.Tensor, *, steps: int = 400, lr: float = 0.05, progress: bool = True
) -> dict:
    """Fit the attached copy cache's gate on windows (W, L) of training text; returns a report."""
    if model.copy_cache is None:
        raise ValueError("fit_copy_cache: the model has no copy cache; call attach_copy_cache first")
    began = time.perf_counter()
    stats = copy_cache_statistics(model, windows, progress=progress)
    terms = gate_terms(model.copy_cache)
    head, report = fit_gate(stats, model.config.copy_cache_orders, **terms, steps=steps, lr=lr)
    with torch.no_grad():
        model.copy_cache.gate.copy_(head.gate.to(model.copy_cache.gate))
        if terms["seen"]:
            model.copy_cache.seen_gate.copy_(head.seen_gate.to(model.copy_cache.seen_gate))
    return report | {
        "orders": list(model.config.copy_cache_orders),
        "buckets": model.config.copy_cache_buckets,
        **{key: terms[key] for key in ("prior", "rate", "count_cap")},  # which of the cue's optional terms seen_gate holds; the cap (0: none)
        "fit_tokens": int(stats["lse"].numel()),
        "matched_share": round(float(stats["valid"].any(-1).float().mean()), 4),  # positions with any prediction
        "seconds": round(time.perf_counter() - began, 1),
    }
