"""The study's table, results.json, gaps and plots, rebuilt from the finished runs' result.json.

Gap of Harmonic vs a baseline at a context, as in the research summary: the baseline's loss minus
Harmonic's, in percent of the baseline's (positive: Harmonic is better). Ablations and options are
reported as a difference in bits (variant minus Harmonic; positive: the variant is worse) and with
their own gaps to the baselines.
"""

from __future__ import annotations

import json
from pathlib import Path

from hallamonic.study.recipe import ARCHITECTURES, StudyRecipe

BASELINES = ("transformer", "mamba", "mamba-llama-layout")  # the last: Mamba's mixer in Harmonic's layout
VARIANTS = tuple(name for name in ARCHITECTURES if name.startswith("harmonic-"))  # rows set against `harmonic`


def collect(out: Path, recipe: StudyRecipe) -> dict:
    """results.json's content from runs/*/ctx-*/result.json (missing runs are simply absent)."""
    models: dict[str, dict] = {}
    unit = None
    for name in recipe.models:
        for context in recipe.contexts:
            path = out / "runs" / name / f"ctx-{context}" / "result.json"
            if not path.is_file():
                continue
            record = json.loads(path.read_text())
            unit = record["unit"]
            entry = models.setdefault(
                name, {"params": record["params"], "bits": {}, "valid_bits": {}, "train_seconds": {}, "train_tokens_per_s": {}}
            )
            if record["bits"] is None:  # did not fit in memory
                entry.setdefault("failed", {})[str(context)] = record.get("status", "failed")
                continue
            entry["bits"][str(context)] = record["bits"]
            if record.get("valid_bits") is not None:
                entry["valid_bits"][str(context)] = record["valid_bits"]
            entry["train_seconds"][str(context)] = record["train_seconds"]
            entry["train_tokens_per_s"][str(context)] = record["train_tokens_per_s"]
    harmonic = models.get("harmonic", {}).get("bits", {})
    baselines = [base for base in BASELINES if base in models]
    variants = {
        name: {c: models[name]["bits"][c] - harmonic[c] for c in harmonic if c in models[name]["bits"]}
        for name in VARIANTS if name in models
    }
    return {
        "recipe": recipe.name, "unit": unit, "contexts": recipe.contexts, "models": models,
        "gap_percent": {base: _gap_percent(models, "harmonic", base) for base in baselines},
        "variant_delta_bits": variants,
        # Every Harmonic variant against the baselines too: a session that trains only some variants
        # (e.g. one more seed of two rows and Mamba) still gets the numbers the targets are stated in.
        "variant_gap_percent": {name: {base: _gap_percent(models, name, base) for base in baselines} for name in variants},
        "tokens_per_run": recipe.steps * recipe.train.batch_tokens,
    }


def _gap_percent(models: dict, name: str, base: str) -> dict:
    """{context: (base - name) / base in percent} where both were scored (positive: ``name`` is better)."""
    ours, theirs = models.get(name, {}).get("bits", {}), models[base]["bits"]
    return {c: 100 * (theirs[c] - ours[c]) / theirs[c] for c in ours if c in theirs}


def _cells(values: dict, contexts: list[str], fmt: str) -> str:
    """The rest of a table row: one cell per context, formatted, "-" where there is no number."""
    return " | ".join(fmt.format(values[c]) if c in values else "-" for c in contexts) + " |"


def to_markdown(results: dict) -> str:
    contexts = [str(c) for c in results["contexts"]]
    header = "| model | params | " + " | ".join(contexts) + " |"
    lines = [
        f"Test {results['unit'] or 'bits'} at each training context ({results['tokens_per_run']:,} training tokens per run).",
        "", header, "|---|---:|" + "---:|" * len(contexts),
    ]
    for name, entry in results["models"].items():
        failed = entry.get("failed", {})
        cells = [f"{entry['bits'][c]:.4f}" if c in entry["bits"] else ("OOM" if c in failed else "-") for c in contexts]
        lines.append(f"| {name} | {entry['params']:,} | " + " | ".join(cells) + " |")
    for base, gaps in results["gap_percent"].items():
        if gaps:  # rows without a single number (no `harmonic` trained) are left out
            lines.append(f"| gap vs {base} | | " + _cells(gaps, contexts, "{:+.2f}%"))
    for name, deltas in results["variant_delta_bits"].items():
        if deltas:
            lines.append(f"| {name} - harmonic (bits) | | " + _cells(deltas, contexts, "{:+.4f}"))
    lines += ["", "Gap = (baseline - harmonic) / baseline: positive means Harmonic is better."]
    variant_gaps = [(name, base, gaps) for name, by_base in results["variant_gap_percent"].items()
                    for base, gaps in by_base.items() if gaps]
    if variant_gaps:
        lines += ["", "Each Harmonic variant's gap, the same way:", "",
                  "| variant | " + " | ".join(contexts) + " |", "|---|" + "---:|" * len(contexts)]
        for name, base, gaps in variant_gaps:
            lines.append(f"| {name} vs {base} | " + _cells(gaps, contexts, "{:+.2f}%"))
    if any(entry.get("valid_bits") for entry in results["models"].values()):
        lines += ["", "Validation split (for design decisions; the test split above is the study's number):", "",
                  "| model | " + " | ".join(contexts) + " |", "|---|" + "---:|" * len(contexts)]
        for name, entry in results["models"].items():
            lines.append(f"| {name} | " + _cells(entry.get("valid_bits", {}), contexts, "{:.4f}"))
    return "\n".join(lines) + "\n"


def _plot(out: Path, results: dict, recipe: StudyRecipe) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, entry in results["models"].items():
        points = sorted((int(c), b) for c, b in entry["bits"].items())
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("training context (tokens)")
    ax.set_ylabel(f"test {results['unit'] or 'bits'}")
    ax.set_title(f"{recipe.name}: equal budget, {results['tokens_per_run']:,} tokens per run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bits_vs_context.png", dpi=120)
    plt.close(fig)
    written.append(out / "bits_vs_context.png")

    contexts = recipe.contexts
    fig, axes = plt.subplots(1, len(contexts), figsize=(3.2 * len(contexts), 3), sharey=True, squeeze=False)
    for ax, context in zip(axes[0], contexts):
        for name in recipe.models:
            path = out / "runs" / name / f"ctx-{context}" / "metrics.jsonl"
            if not path.is_file():
                continue
            by_step = {}
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("loss") is not None:
                    by_step[row["step"]] = (row["tokens"], row["loss"] / 0.6931471805599453)
            points = [by_step[s] for s in sorted(by_step)]
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name)
        ax.set_title(f"context {context}")
        ax.set_xlabel("training tokens")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("train loss (bits)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "training_curves.png", dpi=120)
    plt.close(fig)
    written.append(out / "training_curves.png")
    return written


def write_report(out: Path, recipe: StudyRecipe) -> dict:
    """Write results.json, results.md and the plots; return the results."""
    results = collect(out, recipe)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(to_markdown(results))
    if results["models"]:
        _plot(out, results, recipe)
    return results
