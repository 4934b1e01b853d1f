"""Measured cost of a conversion recipe: phase-1 and phase-2 tokens/s on this machine.

A recipe's header should state its cost from measured rates, not from a FLOP estimate. This runs
a few optimizer steps of each phase through the pipeline's own code (``run_phase1`` /
``run_phase2``: same modules, losses, mixed precision, micro-batches) on random token ids, and
turns the median step time into tokens/s and into the wall time of the recipe's full phases.
Random weights measure throughput as well as real ones, so a teacher can be a random Llama with
a named model's shapes (``--teacher-shape tinyllama-1.1b``) instead of a download.

Library: :func:`measure_throughput`. CLI: ``hallamonic bench convert RECIPE`` (``convert/cli.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.pipeline import DTYPES, ConversionRun, load_base_model, run_phase1, run_phase2
from hallamonic.convert.recipe import Recipe
from hallamonic.convert.surgery import build_student
from hallamonic.training.trainer import make_accelerator

# Shapes of the models the bundled recipes convert (their config.json), for random teachers.
TEACHER_SHAPES = {
    "tinyllama-1.1b": dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
    ),
    "smollm2-135m": dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
    ),
}


class _StepRecords:
    """Keeps ``run_phase``'s per-step metrics in memory (the interface of ``MetricsLog``)."""

    def __init__(self):
        self.records: list[dict] = []

    def write(self, **record) -> None:
        self.records.append(record)


def random_teacher(shape: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A randomly initialised LlamaForCausalLM with the shapes of ``TEACHER_SHAPES[shape]``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in TEACHER_SHAPES:
        raise ValueError(f"unknown teacher shape {shape!r}; known: {', '.join(TEACHER_SHAPES)}")
    config = LlamaConfig(**TEACHER_SHAPES[shape], rope_theta=10000.0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval().requires_grad_(False)


def measure_throughput(
    recipe: Recipe, *, teacher_shape: str | None = None, steps: int = 4, warmup: int = 1, load_teacher=None
) -> dict:
    """Time ``warmup + steps`` optimizer steps of each phase of ``recipe``; the warm-up steps
    (allocation, kernel compilation) are left out of the median. Returns one row per phase with
    tokens/s, seconds per step, peak accelerator memory and the estimated wall time of the
    recipe's own step count."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps} and {warmup}")
    accelerator = make_accelerator(recipe.train.mixed_precision)
    dtype = DTYPES[recipe.base.dtype]
    if teacher_shape:
        teacher, spec = random_teacher(teacher_shape, dtype, accelerator.device), f"random:{teacher_shape}"
    else:
        teacher, _ = (load_teacher or load_base_model)(recipe.base.model, dtype=dtype)
        teacher, spec = teacher.eval().requires_grad_(False).to(accelerator.device), recipe.base.model
    student = build_student(teacher, recipe.harmonic, seed=recipe.seed, base_spec=spec).to(accelerator.device)
    timed = dataclasses.replace(recipe.train, on_nan="skip", log_every=1)  # random weights may overflow: time, don't stop
    rows = []
    for name, runner in (("phase1", run_phase1), ("phase2", run_phase2)):
        section = getattr(recipe, name)
        short = dataclasses.replace(section, steps=warmup + steps, warmup_steps=0)
        per_step = short.batch_size * recipe.train.grad_accum * accelerator.num_processes * short.seq_len
        rng = np.random.default_rng(recipe.seed)
        tokens = rng.integers(0, teacher.config.vocab_size, per_step * (warmup + steps) + 1).astype(np.int32)
        run_recipe = dataclasses.replace(recipe, train=timed, checkpoint=dataclasses.replace(recipe.checkpoint, every=0), **{name: short})
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        log = _StepRecords()
        with tempfile.TemporaryDirectory() as scratch:  # the phase's end-of-phase checkpoint lands here
            runner(ConversionRun(run_recipe, student, tokens, accelerator, Path(scratch), log, False), teacher)
        rates = [r["tokens_per_s"] for r in log.records if r.get("tokens_per_s") and r["step"] > warmup]
        if not rates:
            raise RuntimeError(f"{name}: no timed step finished (every step was non-finite?)")
        rate = statistics.median(rates)
        full_tokens = section.steps * per_step
        rows.append({
            "phase": name, "seq_len": section.seq_len, "tokens_per_step": per_step, "timed_steps": len(rates),
            "tokens_per_s": rate, "seconds_per_step": per_step / rate,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
            "recipe_steps": section.steps, "recipe_tokens": full_tokens, "estimated_hours": full_tokens / rate / 3600,
        })
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    return {"recipe": recipe.name, "teacher": spec, "device": device, "mixed_precision": str(accelerator.mixed_precision), "phases": rows}


def format_throughput(result: dict) -> str:
    """A markdown table of :func:`measure_throughput`'s rows."""
    lines = [
        f"{result['recipe']} on {result['device']} (teacher {result['teacher']}, precision {result['mixed_precision']})",
        "",
        "| phase | seq_len | tokens/step | tokens/s | s/step | peak GB | recipe tokens | estimated hours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["phases"]:
        peak = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
        lines.append(
            f"| {r['phase']} | {r['seq_len']:,} | {r['tokens_per_step']:,} | {r['tokens_per_s']:,.0f} | "
            f"{r['seconds_per_step']:.2f} | {peak} | {r['recipe_tokens']:,} | {r['estimated_hours']:.2f} |"
        )
    total = sum(r["estimated_hours"] for r in result["phases"])
    lines += ["", f"Both phases at these rates: {total:.2f} hours (loading, calibration and evaluation not included)."]
    return "\n".join(lines)
