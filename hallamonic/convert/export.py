"""The converted checkpoint on disk: weights, remote code, tokenizer, model card, loss plot.

``export`` writes everything into a staging folder and moves it into place only once complete;
``model_card`` renders ``training/report.json`` as the checkpoint's README.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path

from transformers import GenerationConfig

from hallamonic.convert.recipe import Recipe

# generate()'s default repetition penalty for a converted model with a copy cache. Why: the cache
# raises "what followed this last time", so once greedy decoding repeats a sentence it locks into
# the loop (SmolLM2: repeated 4-grams 0.83 of 64 generated tokens, the teacher 0.42); 1.2 takes it to
# 0.006 (the teacher 0.004; evals/results/smollm2-135m-induction-cache, repetition.py). A user's
# own `repetition_penalty=` still wins; scores (bits, LAMBADA, passkey) never go through generate.
COPY_CACHE_REPETITION_PENALTY = 1.2
FIT_TEXTS = {"unseen": "text no phase trained on", "phase2": "phase-2 training text"}  # copy_cache.fit_text as the card says it


def generation_config_for(student, teacher) -> GenerationConfig | None:
    """The teacher's generation config, with a repetition penalty where the student has a copy cache."""
    generation = getattr(teacher, "generation_config", None)
    if getattr(student, "copy_cache", None) is None:
        return generation
    generation = copy.deepcopy(generation) if generation is not None else GenerationConfig()
    if generation.repetition_penalty in (None, 1.0):
        generation.repetition_penalty = COPY_CACHE_REPETITION_PENALTY
    return generation


def public_name(spec: str) -> str:
    """How an exported checkpoint names its teacher (and data): a hub id (or ``builtin:...``) as is,
    a local folder or file by its name only -- a path on the converting machine means nothing elsewhere."""
    if spec.startswith("builtin:"):
        return spec
    path = Path(spec).expanduser()
    return path.resolve().name if path.exists() else spec


def export(student, tokenizer, teacher, out: Path, recipe: Recipe, report: dict) -> None:
    """Write the loadable checkpoint: weights, remote code, tokenizer, generation config, card.

    Everything is written to a temporary folder first and moved into ``out`` only once complete,
    so a full disk or a crash during export leaves any earlier export and the checkpoints intact.
    """
    student.config.base_model_name_or_path = public_name(recipe.base.model)
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        student.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        generation = generation_config_for(student, teacher)
        if generation is not None:
            generation.save_pretrained(staging)
        (staging / "README.md").write_text(model_card(recipe, report, student.config))
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    (out / "training" / "report.json").write_text(json.dumps(report, indent=1, default=str))


def block_description(config) -> str:
    """One phrase for the card: what each HarmonicBlock keeps, read from the exported config."""
    counts = [len(config.layer_timescale_bands(i)) for i in range(config.num_hidden_layers)]
    usual = max(set(counts), key=counts.count)
    others = {n: [i for i, c in enumerate(counts) if c == n] for n in sorted(set(counts)) if n != usual}
    levels = f"{usual}-level" + "".join(f" ({n}-level in layer(s) {', '.join(map(str, layers))})" for n, layers in others.items())
    if config.state_size == 1:
        return f"{levels} hierarchical state-space mixer with a diagonal state (one number per channel per level)"
    every = range(config.num_hidden_layers)
    hedgehog = [i for i in every if config.layer_feature_map(i) == "hedgehog"]
    taylor = [i for i in every if config.layer_feature_map(i) == "taylor"]
    delta = [i for i in every if config.layer_update_rule(i) == "delta"]
    maps = _layer_phrase("q.k linear attention", "Hedgehog feature maps, normalised read-out", hedgehog, len(every))
    taylor_maps = f"Taylor feature maps (1 + s + s^2/2 on {config.taylor_dims}-dim projections), normalised read-out"
    maps = _layer_phrase(maps, taylor_maps, taylor, len(every))
    writes = _layer_phrase("additive writes", "the gated delta rule (each write replaces what its key held)", delta, len(every))
    return (
        f"{levels} hierarchical state-space mixer with an expanded, selective state: {config.state_size} "
        f"numbers per channel per level, written through per-head keys and read through per-head queries ({maps}; {writes})"
    )


def _layer_phrase(usual: str, special: str, layers: list[int], count: int) -> str:
    """``usual`` / ``special`` / "usual; in layer(s) i, j special" as ``layers`` covers none, all or some."""
    if not layers:
        return usual
    if len(layers) == count:
        return special
    return f"{usual}; in layer(s) {', '.join(map(str, layers))} {special}"


def _phase_minutes(phase: dict) -> str:
    """A phase's wall time for the card; a resumed run counts what its earlier runs spent too."""
    earlier = phase.get("earlier_seconds", 0.0)
    total = f"{(phase['seconds'] + earlier) / 60:.1f} min"
    return f"{total} ({earlier / 60:.1f} before a resume)" if earlier else total


def model_card(recipe: Recipe, report: dict, config) -> str:
    counts = report["parameters"]
    base = public_name(recipe.base.model)
    lines = [
        "---",
        "library_name: transformers",
        "tags: [hallamonic, state-space-model, linearized-attention]",
        f"base_model: {base}",
        "---",
        "",
        f"# Hallamonic conversion of `{base}`",
        "",
        f"Every attention layer was replaced by a HarmonicBlock ({block_description(config)}; no attention, no "
        "positional encoding); FFNs, embeddings and LM head are the teacher's, frozen. "
        "Load with `AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`.",
        "",
        "## Conversion",
        "",
        f"- Recipe: `{recipe.name}` (resolved copy in `training/recipe.yaml`), seed {recipe.seed}",
        f"- Data: `{public_name(recipe.data.path or recipe.data.dataset)}` (held-out fraction {recipe.data.heldout_fraction})",
        f"- Parameters: teacher {counts['teacher']:,}, converted {counts['student']:,} "
        f"({counts['student_trainable']:,} trained)",
        f"- Hardware: {report['hardware']}; wall time {report['wall_seconds'] / 60:.1f} min",
        "",
        "| phase | steps | tokens | seq len | wall time | final loss |",
        "|---|---|---|---|---|---|",
    ]
    for phase in report["phases"]:
        loss = f"{phase['final_loss']:.4f}" if phase["final_loss"] is not None else "-"
        lines.append(
            f"| {phase['name']} | {phase['steps']} | {phase['tokens']:,} | {phase['seq_len']} | {_phase_minutes(phase)} | {loss} |"
        )
    heldout = report.get("heldout") or {}
    if heldout:
        lengths = sorted({int(k) for r in heldout.values() for k in r["bits_per_token"]})
        lines += [
            "",
            "## Held-out bits per token (measured at the end of the conversion)",
            "",
            "| model | " + " | ".join(f"ctx {n}" for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        for name, result in heldout.items():
            cells = [f"{result['bits_per_token'][str(n)]:.3f}" if str(n) in result["bits_per_token"] else "n/a" for n in lengths]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", f"Held-out documents of the training source; tokens scored: {heldout.get('converted', {}).get('tokens')}."]
    transfer = report.get("attention_transfer") or {}
    if transfer.get("normalised_mse"):
        lines += [
            "",
            "## Attention transfer",
            "",
            f"Per-layer MSE of each HarmonicBlock to its teacher attention's output, divided by that output's mean square "
            f"(1.0 = predicting zeros), on {transfer['sample']}:",
            "",
            "| stage | mean | best layer | worst layer |",
            "|---|---|---|---|",
        ]
        for stage, errors in transfer["normalised_mse"].items():
            lines.append(f"| {stage} | {sum(errors) / len(errors):.3f} | {min(errors):.3f} | {max(errors):.3f} |")
    refit = report.get("refit")
    if refit:
        pairs = ", ".join(f"layer {i}: {b:.3f} -> {a:.3f}" for i, b, a in zip(refit["layers"], refit["before"], refit["after"]))
        lines += [
            "",
            f"The same error measured on the inputs the converted model gives those layers (the teacher's attention restored "
            f"there, blocks everywhere else), before and after `phase2-refit`: {pairs}.",
        ]
    cache = report.get("copy_cache")
    if cache:
        lines += [
            "",
            "## Copy cache",
            "",
            f"On top of the LM head, exact n-gram recall over token ids (orders {cache['orders']}, {cache['buckets']:,} hash "
            "buckets each): the token that followed the last earlier occurrence of the current n tokens gets its logit raised "
            "by softplus(a_n + b_n x the model's entropy + f_n x the model's log-probability of that token + o_n where a "
            "longer order predicts another token"
            + (" + w_n where that token continues a word, e.g. \"ou\" after \" Kar\"" if len(cache["gate"][0]) > 4 else "")
            + "). "
            + ("With the context-word cue, every token already in the context is raised too, by softplus(c + d x entropy + "
               "e x its log-probability + g x log of its count so far"
               + (f" (at most {cache['count_cap']})" if cache.get("count_cap") else "")
               + (" + h x its log unigram frequency in the conversion's training text" if cache.get("prior", len(cache["seen_gate"]) > 4) else "")
               + (" + q x log of the tokens so far" if cache.get("rate") else "")
               + f") (fitted: {cache['seen_gate']}; the n-gram gate alone "
               f"{cache['nll_ngram_only']} nats/token). " if "seen_gate" in cache else "")
            + "It recalls verbatim repeats at any distance in constant memory; "
            f"it cannot recall what is asked in other words. Gate fitted on {cache['fit_tokens']:,} tokens of "
            f"{FIT_TEXTS.get(cache.get('fit_text', 'phase2'))}: "
            f"{cache['nll_before']} -> {cache['nll_after']} nats/token. Greedy decoding with the cache repeats itself, so "
            f"`generate` defaults to `repetition_penalty={COPY_CACHE_REPETITION_PENALTY}` (generation_config.json); "
            "`model.copy_cache = None` turns the cache off.",
        ]
    continuations = report.get("continuations") or {}
    if continuations:
        quote = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines += [
            "",
            "## Greedy continuation",
            "",
            f"Prompt: *{quote(continuations['prompt'])}*",
            "",
            "| teacher | converted |",
            "|---|---|",
            f"| {quote(continuations['teacher'])} | {quote(continuations['converted'])} |",
        ]
    lines += [
        "",
        "Phase 1 loss is the per-layer MSE to the teacher's attention output divided by its mean square; "
        "phase 2 loss is `phase2.ce_weight` x next-token cross-entropy plus `phase2.kl_weight` x KL(teacher || student), in nats, "
        "plus `phase2.hidden_weight` x the per-token normalised distance of every layer's output to the teacher's.",
        "",
    ]
    return "\n".join(lines)


def plot_losses(metrics: Path, png: Path) -> None:
    if not metrics.is_file():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[int, float]] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("loss") is not None:
            series.setdefault(record["phase"], {})[record["step"]] = record["loss"]  # last write wins on resume
    if not series:
        return
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.5), squeeze=False)
    labels = {"phase1": "attention-transfer loss (normalised MSE)", "phase1-focus": "normalised MSE, focus layers", "phase2-refit": "normalised MSE, refit layers, converted inputs", "phase2": "ce_weight x CE + kl_weight x KL + hidden_weight x distance"}
    for ax, (phase, points) in zip(axes[0], sorted(series.items())):
        steps = sorted(points)
        ax.plot(steps, [points[s] for s in steps], marker=".")
        ax.set_title(phase)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(labels.get(phase, "loss"))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
