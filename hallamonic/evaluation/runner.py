"""Run one task on a model and its baselines, one model in memory at a time.

Models are loaded, evaluated and freed in turn so a converted 1.1B model and its teacher
never sit in memory together; the data is read once, before any model loads, so bad input
fails fast.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hallamonic.evaluation import data as evaldata
from hallamonic.evaluation.baselines import (
    DEFAULT_NTK_FACTOR,
    Entry,
    apply_rope_scaling,
    baseline_entries,
    rope_window,
    teacher_spec,
)
from hallamonic.evaluation.context import evaluate_context
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.evaluation.passkey import evaluate_passkey
from hallamonic.evaluation.scoring import is_recurrent

TASKS = ("lambada", "context", "passkey")
DEFAULT_LENGTHS = {"context": [1024, 4096, 8192], "passkey": [1024, 2048, 4096, 8192, 16384]}


@dataclass
class EvalOptions:
    """Everything a task needs besides the model; the CLI fills it from its flags."""

    task: str
    data: str | None = None
    limit: int | None = None
    lengths: list[int] = field(default_factory=list)
    trials: int = 10
    seed: int = 0
    batch_size: int = 8
    max_attention_length: int | None = None
    ntk_factor: float = DEFAULT_NTK_FACTOR
    progress: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        self.lengths = list(self.lengths or DEFAULT_LENGTHS.get(self.task, []))
        bad = [n for n in self.lengths if not isinstance(n, int) or n < 2]
        if bad:
            raise ValueError(f"context lengths must be integers >= 2, got {bad}")


def load_inputs(options: EvalOptions) -> list[str] | None:
    """Texts for the task (None for passkey, whose prompts are synthetic)."""
    if options.task == "lambada":
        return evaldata.lambada_texts(options.data, options.limit)
    if options.task == "context":
        # ~4-5 characters per token: enough text for `limit` (default 4) windows at the longest length
        min_chars = max(2_000_000, 5 * max(options.lengths) * (options.limit or 4))
        return evaldata.heldout_texts(options.data, min_chars=min_chars)
    return None


def evaluate_model(model, tokenizer, options: EvalOptions, texts: list[str] | None) -> dict:
    """One task on one loaded model."""
    common = {"max_attention_length": options.max_attention_length, "progress": options.progress}
    if options.task == "lambada":
        return evaluate_lambada(model, tokenizer, texts, batch_size=options.batch_size, **common)
    if options.task == "context":
        return evaluate_context(model, tokenizer, texts, options.lengths, limit=options.limit, **common)
    trials = min(options.trials, options.limit) if options.limit else options.trials
    return evaluate_passkey(model, tokenizer, options.lengths, trials=trials, seed=options.seed, **common)


def describe(model, entry: Entry, seconds: float) -> dict:
    """What the results must say about the model so a table can be read on its own."""
    info = {"model": entry.spec, "seconds": round(seconds, 1), "recurrent": is_recurrent(model)}
    if not is_recurrent(model) and getattr(model.config, "max_position_embeddings", None):
        info["rope_window"] = rope_window(model.config)
    return info | entry.info


def _load_teacher(load, spec: str, recorded: bool):
    """The teacher for a baseline; one named by the model's config gets a hint when it cannot load
    (a converted model records a local teacher by its folder or file name only)."""
    try:
        return load(spec)
    except (OSError, ValueError) as err:
        if not recorded:
            raise
        raise ValueError(
            f"cannot load the teacher {spec!r} recorded in the model's config ({str(err).splitlines()[0]}); "
            "a local teacher is recorded by its name only: pass --teacher PATH"
        ) from err


def run_evaluation(spec: str, options: EvalOptions, *, baselines=(), teacher=None, name=None, load=None) -> dict:
    """{model name: result} for `spec` and each requested baseline (in that order).

    `load(spec) -> (model, tokenizer)` defaults to `hallamonic.loading.load_causal_lm`.
    """
    if load is None:
        from hallamonic.loading import load_causal_lm as load
    texts = load_inputs(options)
    results: dict[str, dict] = {}
    model, tokenizer = load(spec)
    recurrent = is_recurrent(model)
    recorded = teacher is None and teacher_spec(model, None) is not None
    teacher = teacher_spec(model, teacher) or (None if recurrent else spec)
    main_is_teacher = not recurrent and str(teacher) == str(spec)
    entries = [Entry(name or ("teacher" if main_is_teacher else Path(str(spec)).name), str(spec))]
    if baselines:
        if teacher is None:
            raise ValueError("baselines need the teacher: pass --teacher SPEC (the config records no base model)")
        entries += baseline_entries(list(baselines), str(teacher), main_is_teacher)
    target = max(options.lengths) if options.lengths else 0
    for i, entry in enumerate(entries):
        if i:
            model, tokenizer = _load_teacher(load, entry.spec, recorded)
        if entry.rope:
            target_len = max(target, rope_window(model.config))
            entry.info["rope_parameters"] = apply_rope_scaling(model, entry.rope, target_len, options.ntk_factor)
        started = time.time()
        result = evaluate_model(model, tokenizer, options, texts)
        results[entry.name] = result | describe(model, entry, time.time() - started)
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results
