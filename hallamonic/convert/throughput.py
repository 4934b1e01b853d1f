"""Measured cost of a conversion recipe: each training phase's tokens/s on this machine.

A recipe's header should state its cost from measured rates, not from a FLOP estimate. This runs
a few optimizer steps of each phase the recipe trains through the pipeline's own code
(``run_phase1``, ``run_phase1_focus``, ``run_phase2``, ``run_phase2_refit``: same modules, losses,
mixed precision, micro-batches) on random token ids, and turns the median step time into tokens/s
and into the wall time of the recipe's full phases. The focus and the refit train over a pool
whose teacher I/O is captured at each sequence's first visit; here the pool is one step's
sequences, captured in the first (untimed) step, so their rows time the steady steps and leave
the capture (one teacher pass per pooled sequence, once) out.
Random weights measure throughput as well as real ones, so a teacher can be a random Llama with
a named model's shapes (``--teacher-shape tinyllama-1.1b``) instead of a download.

Library: :func:`measure_throughput`. CLI: ``hallamonic bench convert RECIPE`` (``convert/cli.py``).
"""

from __future__ import annotations

import functools
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.pipeline import (
    DTYPES, ConversionRun, load_base_model, run_phase1, run_phase1_focus, run_phase2, run_phase2_refit, teacher_in_dtype,
)
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


def _timed_phases(recipe: Recipe, steps: int, warmup: int, sequences: int) -> list[dict]:
    """The phases the recipe trains (the pipeline's conditions: steps > 0), each with its runner,
    the recipe's own step count, the section that sets its batch shape, whether it is pooled, and
    a recipe shortened to its untimed steps plus ``steps``. Pooled phases (focus, refit) get a pool
    of ``sequences``, captured in their first step, which is therefore never timed."""
    p1, p2 = recipe.phase1, recipe.phase2
    pooled_skip = max(warmup, 1)  # a pooled phase's first step captures its pool
    phases = [
        dict(name="phase1", recipe_steps=p1.steps, runner=run_phase1, section=p1, pooled=False, untimed=warmup, teacher_dtype=p1.teacher_dtype,
             short=replace(recipe, phase1=replace(p1, steps=warmup + steps, warmup_steps=0))),
        dict(name="phase1-focus", recipe_steps=p1.focus_steps, runner=run_phase1_focus, section=p1, pooled=True, untimed=pooled_skip, teacher_dtype=p1.teacher_dtype,
             short=replace(recipe, phase1=replace(p1, focus_steps=pooled_skip + steps, focus_pool=sequences))),
        dict(name="phase2", recipe_steps=p2.steps, runner=run_phase2, section=p2, pooled=False, untimed=warmup, teacher_dtype=p2.teacher_dtype if p2.distils else None,
             short=replace(recipe, phase2=replace(p2, steps=warmup + steps, warmup_steps=0))),
        dict(name="phase2-refit", recipe_steps=p2.refit_steps, runner=_refit_runner, section=p1, pooled=True, untimed=pooled_skip, teacher_dtype=p1.teacher_dtype,
             short=replace(recipe, phase2=replace(p2, refit_steps=pooled_skip + steps, refit_pool=sequences))),
    ]  # fmt: skip
    return [phase for phase in phases if phase["recipe_steps"] > 0]


def _refit_runner(run: ConversionRun, teacher):
    """``run_phase2_refit`` on a random probe of two phase-1-length sequences."""
    probe = torch.randint(0, teacher.config.vocab_size, (2, run.recipe.phase1.seq_len), device=run.accelerator.device)
    return run_phase2_refit(run, teacher, probe)


def measure_throughput(
    recipe: Recipe, *, teacher_shape: str | None = None, steps: int = 4, warmup: int = 1, load_teacher=None
) -> dict:
    """Time ``warmup + steps`` optimizer steps of each phase of ``recipe``; the warm-up steps
    (allocation, kernel compilation, the focus / refit pool's capture) are left out of the median.
    Returns one row per phase with tokens/s, seconds per step, peak accelerator memory and the
    estimated wall time of the recipe's own step count."""
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
    teacher_in = functools.cache(lambda dtype: teacher_in_dtype(teacher, dtype))  # the pipeline's teacher copies, one per dtype
    timed = replace(recipe.train, on_nan="skip", log_every=1)  # random weights may overflow: time, don't stop
    sequences = recipe.phase1.batch_size * recipe.train.grad_accum * accelerator.num_processes  # one pooled step's
    rows = []
    for phase in _timed_phases(recipe, steps, warmup, sequences):
        name, section = phase["name"], phase["section"]
        skip = phase["untimed"]
        per_step = section.batch_size * recipe.train.grad_accum * accelerator.num_processes * section.seq_len
        rng = np.random.default_rng(recipe.seed)
        tokens = rng.integers(0, teacher.config.vocab_size, per_step * (skip + steps) + 1).astype(np.int32)
        run_recipe = replace(phase["short"], train=timed, checkpoint=replace(recipe.checkpoint, every=0))
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        log = _StepRecords()
        with tempfile.TemporaryDirectory() as scratch:  # the phase's end-of-phase checkpoint lands here
            run = ConversionRun(run_recipe, student, tokens, accelerator, Path(scratch), log, False)
            phase["runner"](run, teacher_in(phase["teacher_dtype"]))
        rates = [r["tokens_per_s"] for r in log.records if r.get("tokens_per_s") and r["step"] > skip]
        if not rates:
            raise RuntimeError(f"{name}: no timed step finished (every step was non-finite?)")
        rate = statistics.median(rates)
        full_tokens = phase["recipe_steps"] * per_step
        rows.append({
            "phase": name, "seq_len": section.seq_len, "tokens_per_step": per_step, "timed_steps": len(rates),
            "tokens_per_s": rate, "seconds_per_step": per_step / rate,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
            "recipe_steps": phase["recipe_steps"], "recipe_tokens": full_tokens, "estimated_hours": full_tokens / rate / 3600,
            "pooled": phase["pooled"],
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
    lines += ["", f"All {len(result['phases'])} phases at these rates: {total:.2f} hours (loading, calibration and evaluation not included)."]
    pooled = [r["phase"] for r in result["phases"] if r.get("pooled")]
    if pooled:
        lines.append(f"{' and '.join(pooled)}: steps over a pool whose teacher I/O is captured once; that capture "
                     "(one teacher pass per pooled sequence) is not in these rows.")
    return "\n".join(lines)
