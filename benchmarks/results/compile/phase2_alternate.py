"""phase2.compile side by side in ONE process: run_phase2 of the smollm2-135m recipe (a fresh
surgery of the GGUF teacher, real FineWeb tokens), 4 steps eager, 4 steps compiled, twice over.
Separate processes on this VM differ by up to 2x on identical work, so only an in-process
alternation resolves a ~1.4x step difference.

Usage (repo root; needs outputs/smollm2-n64/training/tokens.npy, see evals/smollm2_selective.sh):
    python benchmarks/results/compile/phase2_alternate.py
Prints seconds per step (1,024 tokens) of each 4-step block.
"""
import dataclasses, statistics, tempfile, time
from pathlib import Path
import numpy as np, torch
from hallamonic.convert.recipe import load_recipe
from hallamonic.convert.pipeline import DTYPES, ConversionRun, load_base_model, run_phase2
from hallamonic.convert.surgery import build_student
from hallamonic.convert.throughput import _StepRecords
from hallamonic.training.trainer import make_accelerator
from hallamonic.loading import smollm2_gguf_path
recipe = load_recipe("smollm2-135m", [f"base.model={smollm2_gguf_path()}"])
acc = make_accelerator(recipe.train.mixed_precision)
teacher, _ = load_base_model(recipe.base.model, dtype=torch.float32)
teacher.eval().requires_grad_(False)
student = build_student(teacher, recipe.harmonic, seed=0, base_spec="x")
tokens = np.load("outputs/smollm2-n64/training/tokens.npy")
timed = dataclasses.replace(recipe.train, on_nan="skip", log_every=1)
for rep in range(2):
    for compile in (False, True):
        short = dataclasses.replace(recipe.phase2, steps=4, warmup_steps=0, compile=compile)
        rr = dataclasses.replace(recipe, train=timed, checkpoint=dataclasses.replace(recipe.checkpoint, every=0), phase2=short)
        log = _StepRecords()
        with tempfile.TemporaryDirectory() as scratch:
            run_phase2(ConversionRun(rr, student, tokens[rep*8192:], acc, Path(scratch), log, False), teacher)
        print(rep, "compile" if compile else "eager", [round(1024 / r["tokens_per_s"], 2) for r in log.records], flush=True)
