"""The copy cache's fit on a finished conversion: where its time goes, and the L-BFGS loss three ways.

The conversion's last step (`fit_copy_cache`) runs the model once over the fit windows to take the
slot statistics, then fits the gates: Adam on the n-gram gate, L-BFGS (~70 loss evaluations) on
both. With the context-word cue each evaluation runs over every position and every slot (the
window's distinct tokens: ~1,700 on the recipe's 4,096-token windows). This script times, in one
process, the statistics forward and one loss evaluation (forward + backward) of:

- ``reference``: ``seen_cached_nll``, the model's own formulas (the fit's reported loss);
- ``fast, one group``: ``fast_seen_cached_nll`` over all slots (the fit's loss before 2026-12-07);
- ``fast, N groups``: positions sorted by how many slots they have seen and cut into N groups,
  each keeping its seen prefix (the fit's loss now; needs slots in first-occurrence order);

rounds alternated so CPU drift hits all alike, then the whole gate fit as the conversion runs it.

Usage: python benchmarks/copy_cache_fit.py RUN [--windows 12] [--rounds 3] [--groups 16]
(RUN: a conversion's output folder with a context-word cue, e.g. outputs/smollm2-seed4-rate;
its training/tokens-copy-cache.npy, or tokens-phase2.npy with fit_text phase2, gives the windows).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.copy_cache import (
    copy_cache_statistics, fast_seen_cached_nll, fit_gate, gate_terms, seen_cached_nll, slot_terms,
)
from hallamonic.convert.pipeline import _copy_cache_windows
from hallamonic.convert.recipe import load_recipe
from hallamonic.modeling import HallamonicForCausalLM


def fit_windows(run: Path, count: int | None) -> torch.Tensor:
    """(W, L) the windows the run's conversion fitted its gate on (its first ``count``)."""
    recipe = load_recipe(str(run / "training" / "recipe.yaml"))
    stream = {"unseen": "tokens-copy-cache.npy", "phase2": "tokens-phase2.npy"}[recipe.copy_cache.fit_text]
    tokens = np.load(run / "training" / stream)
    windows, _ = _copy_cache_windows(recipe, {"copy_cache": tokens, "phase2": tokens}, notify=print)
    return windows[:count]


def seconds(fn) -> float:
    """Wall time of fn() (a loss), its backward included."""
    began = time.perf_counter()
    fn().backward()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--windows", type=int, default=None, help="fit windows used (default: the recipe's)")
    parser.add_argument("--rounds", type=int, default=3, help="timed loss evaluations per variant")
    parser.add_argument("--groups", type=int, default=16, help="position groups of the fast loss (the fit's default: 16)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = HallamonicForCausalLM.from_pretrained(args.run).eval()
    head = model.copy_cache
    if head is None or head.seen_gate is None:
        raise SystemExit(f"{args.run}: the model has no copy cache with the context-word cue; nothing to time")
    windows = fit_windows(args.run, args.windows)
    began = time.perf_counter()
    stats = copy_cache_statistics(model, windows, progress=False)
    print(f"statistics forward: {time.perf_counter() - began:.1f} s on {tuple(windows.shape)} windows, "
          f"{stats['slot_count'].shape[1]} slots")
    with torch.no_grad():  # the gates as the run fitted them: a loss away from any start
        grouped, single = slot_terms(stats, head, chunks=args.groups), slot_terms(stats, head, chunks=1)
    kept = sum(group["slot_logit"].numel() for group in grouped) / stats["slot_count"].numel()
    variants = {
        "reference": lambda: seen_cached_nll(stats, head),
        "fast, one group": lambda: fast_seen_cached_nll(single, head),
        f"fast, {args.groups} groups": lambda: fast_seen_cached_nll(grouped, head),
    }
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, loss in variants.items():
            head.zero_grad()
            times[name].append(seconds(loss))
    reference = statistics.median(times["reference"])
    with torch.no_grad():
        values = {name: float(loss()) for name, loss in variants.items()}
    print(f"one loss evaluation, forward + backward (median of {args.rounds}); groups keep {kept:.2f} of the slot entries")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(f"  {name:<18} {median:6.2f} s   {reference / median:5.2f}x the reference   NLL {values[name]:.5f}")
    began = time.perf_counter()
    _, report = fit_gate(stats, model.config.copy_cache_orders, **gate_terms(head))
    print(f"gate fit (Adam, then L-BFGS on the grouped loss): {time.perf_counter() - began:.1f} s, NLL "
          f"{report['nll_before']} -> {report['nll_after']}, cue {report['seen_gate']}")


if __name__ == "__main__":
    main()
