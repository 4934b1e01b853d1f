"""Does the copy cache's gate fit better on text the model never trained on?

The product fits the gate (n-gram orders and the context-word cue) on windows of the phase-2 text,
which phase 2 and the refit have just trained on: a model that has seen a window predicts its
document's own words better than it would on new text, so the fit may learn that copying is worth
less than it is. (On seed 3 the context-word cue gains 0.0047 nats on the fit windows but 0.019 on
the held-out file.) This refits the product's own head (`fit_copy_cache`, same steps) on either

  phase2  the product's windows (`_copy_cache_windows` over the run's saved phase-2 stream), or
  unseen  48 x 1,024 tokens of the recipe's `data` source (FineWeb) right after the end of the
          run's transfer stream: the same tokenizer and document split, text no phase has read (what
          `copy_cache.fit_text: unseen` makes the product fit on),

and scores the package's evaluations (held-out bits @1K, LAMBADA 300, passkey 1K / 2K / 4K).

Usage (repository root): python evals/results/smollm2-135m-induction-cache/fit_text_probe.py MODEL
                          [--source phase2,unseen] [--tasks bits,lambada,passkey]
MODEL is a conversion's output folder with the copy cache (its training/ holds the token streams)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.copy_cache import fit_copy_cache
from hallamonic.convert.data import tokenize_stream
from hallamonic.convert.pipeline import _copy_cache_windows
from hallamonic.convert.recipe import load_recipe
from hallamonic.loading import load_causal_lm

sys.path.insert(0, str(Path(__file__).parent))
from cache_probe import recorder, score_tasks  # noqa: E402

record = recorder("fit_text_probe.jsonl")


def fit_windows(source: str, run: Path, recipe, tokenizer) -> torch.Tensor:
    """(48, 1024) windows of the chosen text, drawn by the product's own `_copy_cache_windows`."""
    recipe.copy_cache.fit_text = source
    streams = {"phase2": np.load(run / "training" / "tokens-phase2.npy")}
    if source == "unseen":  # what the pipeline loads: `data` right past the run's transfer stream
        seen = len(np.load(run / "training" / "tokens.npy"))
        wanted = recipe.copy_cache.fit_windows * recipe.copy_cache.fit_length
        streams["copy_cache"] = tokenize_stream(tokenizer, recipe.data, seed=recipe.seed, max_tokens=seen + wanted)[seen:]
    return _copy_cache_windows(recipe, streams)[0]


def load_run(folder: str):
    """(run folder, its recipe, the model in eval mode, tokenizer), on 2 threads."""
    torch.set_num_threads(2)
    run = Path(folder)
    model, tokenizer = load_causal_lm(run)[:2]
    return run, load_recipe(str(run / "training" / "recipe.yaml")), model.eval(), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--source", default="phase2,unseen")
    parser.add_argument("--tasks", default="bits,lambada,passkey")
    args = parser.parse_args()
    run, recipe, model, tokenizer = load_run(args.model)
    for source in args.source.split(","):
        report = fit_copy_cache(model, fit_windows(source, run, recipe, tokenizer), steps=recipe.copy_cache.fit_steps,
                                lr=recipe.copy_cache.fit_lr, progress=False)
        row = {"model": run.name, "fit_text": source, "fit_nll_before": report["nll_before"],
               "fit_nll_after": report["nll_after"], "gate": report["gate"], "seen_gate": report.get("seen_gate")}
        record(row | {"task": "fit", "seconds": report["seconds"]})
        score_tasks(model, tokenizer, args.tasks.split(","), {"model": run.name, "fit_text": source}, record, [1024])


if __name__ == "__main__":
    main()
