"""Tables, results.json and plots for evaluation results.

`results` is always {model name: task result}; results.json holds the bare task object when a
single model ran, and the {name: object} map when baselines ran alongside it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _length_table(results: dict, field: str, digits: int) -> str:
    """Models as rows, lengths as columns; 'not run' where a length was skipped."""
    lengths = sorted({int(k) for r in results.values() for k in (*r[field], *r.get("not_run", {}))})
    lines = ["| model | " + " | ".join(str(n) for n in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
    for name, r in results.items():
        cells = [_fmt(r[field][str(n)], digits) if str(n) in r[field] else "not run" for n in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [
        f"- {name} at {n}: not run ({why})" for name, r in results.items() for n, why in r.get("not_run", {}).items()
    ]
    return "\n".join(lines + ([""] + notes if notes else []))


def markdown_table(results: dict) -> str:
    """A readable table for one task (markdown, also fine in a terminal)."""
    task = next(iter(results.values()))["task"]
    if task == "lambada":
        lines = ["| model | accuracy | perplexity | n |", "|---|---|---|---|"]
        for name, r in results.items():
            lines.append(f"| {name} | {_fmt(r['accuracy'], 4)} | {_fmt(r['perplexity'], 2)} | {r['n']} |")
        return "\n".join(lines)
    if task == "context":
        table = "Bits per token by context length\n\n" + _length_table(results, "bits_per_token", 3)
        for name, r in results.items():
            for length, buckets in r["by_position"].items():
                if len(buckets) > 1:
                    cells = ", ".join(f"{k}: {v:.3f}" for k, v in buckets.items())
                    table += f"\n- {name} @ {length}, bits by position: {cells}"
        return table
    table = f"Passkey accuracy by length ({next(iter(results.values()))['trials']} trials each)\n\n" + _length_table(
        results, "accuracy", 2
    )
    for name, r in results.items():
        if r.get("key_tokens"):  # absent in results written before the partial credit existed
            cells = ", ".join(f"{n}: {v:.2f}" for n, v in r["key_tokens"].items())
            table += f"\n- {name}, key tokens right (teacher-forced): {cells}"
    return table


def write_results(results: dict, output_dir: str | Path) -> Path:
    """results.json in `output_dir`: the bare object for one model, else keyed by model name."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = next(iter(results.values())) if len(results) == 1 else results
    path = out / "results.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def plot_results(results: dict, output_dir: str | Path) -> list[Path]:
    """PNG plots: context (bits/token vs length; bits by position) and passkey (accuracy vs length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = next(iter(results.values()))["task"]
    out = Path(output_dir)
    paths = []
    measured = {"context": "bits_per_token", "passkey": "accuracy"}.get(task)
    if measured and not any(r.get(measured) for r in results.values()):
        return paths  # every length was skipped (e.g. shorter than the prompt): nothing to draw
    if task == "context":
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for name, r in results.items():
            xs = sorted(int(k) for k in r["bits_per_token"])
            ax1.plot(xs, [r["bits_per_token"][str(x)] for x in xs], marker="o", label=name)
            if xs:  # loss by position at the longest length this model ran
                buckets = r["by_position"][str(xs[-1])]
                mids = [(int(k.split("-")[0]) + int(k.split("-")[1])) / 2 for k in buckets]
                ax2.plot(mids, list(buckets.values()), marker=".", label=f"{name} @ {xs[-1]}")
        ax1.set(xscale="log", xlabel="context length (tokens)", ylabel="bits per token", title="Held-out loss")
        ax2.set(xscale="log", xlabel="position in window (tokens)", ylabel="bits per token", title="Loss by position")
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        paths.append(out / "context.png")
    elif task == "passkey":
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in results.items():
            xs = sorted(int(k) for k in r["accuracy"])
            ax.plot(xs, [r["accuracy"][str(x)] for x in xs], marker="o", label=name)
        ax.set(xlabel="prompt length (tokens)", ylabel="accuracy", ylim=(-0.05, 1.05), title="Passkey retrieval")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(out / "passkey.png")
    else:
        return paths
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    return paths
