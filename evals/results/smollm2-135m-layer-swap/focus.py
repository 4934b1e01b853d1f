"""A focused phase 1: more attention-transfer steps on some layers before phase 2.

Takes a finished phase 1 (SRC/training/checkpoints/phase1, e.g. outputs/smollm2-n64's), trains the
blocks of LAYERS for STEPS more AdamW steps on their teacher attention I/O exactly as `retrain.py`
does (48 x 512 training sequences captured once, lr 1e-3 warm-up + cosine, batch 4), and writes a
copy of that phase-1 checkpoint with the retrained blocks to OUT, ready for phase 2:

    python evals/results/smollm2-135m-layer-swap/focus.py outputs/smollm2-n64 outputs/focus-src 20-24 --steps 400
    SRC=outputs/focus-src bash evals/results/smollm2-135m-phase2-sweep/run.sh focus-20-24 --set phase2.lr=2.0e-4
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hallamonic.convert.pipeline import _transfer_probe, load_base_model
from hallamonic.convert.recipe import load_recipe
from hallamonic.convert.surgery import build_student
from hallamonic.loading import smollm2_gguf_path
from hallamonic.training.checkpoint import latest_checkpoint
from hallamonic.training.packing import PackedBatches
from retrain import TRAIN_SEQS, capture, normalised_mse, train
from swap import parse_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("layers")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    source = latest_checkpoint(args.src / "training/checkpoints/phase1")
    if source is None:
        raise SystemExit(f"no phase-1 checkpoint under {args.src}/training/checkpoints/phase1")
    recipe = load_recipe("smollm2-135m", [f"base.model={smollm2_gguf_path()}", "data.path=../shared/data/fineweb_train.jsonl"])
    teacher, tokenizer = load_base_model(recipe.base.model)
    teacher.eval().requires_grad_(False)
    student = build_student(teacher, recipe.harmonic, seed=recipe.seed)
    weights = load_file(source / "weights.safetensors")
    params = dict(student.named_parameters())
    with torch.no_grad():
        for key, value in weights.items():
            params[key].copy_(value)
    layers = parse_layers(args.layers, len(teacher.model.layers))
    tokens = np.load(args.src / "training/tokens.npy")
    train_io = capture(teacher, PackedBatches(tokens, 512, seed=0).sequences[:TRAIN_SEQS], layers)
    probe, _ = _transfer_probe(recipe, tokens, tokenizer)
    held = capture(teacher, probe, layers)
    start = time.time()
    errors = {}
    for i in layers:
        block = student.model.layers[i].mixer
        errors[i] = {"before": normalised_mse(block, *held[i])}
        train(block, *train_io[i], steps=args.steps, lr=args.lr, seed=i)
        errors[i]["after"] = normalised_mse(block, *held[i])
        print(f"layer {i}: {errors[i]['before']:.3f} -> {errors[i]['after']:.3f}", flush=True)
    target = args.out / "training/checkpoints/phase1" / source.name
    target.mkdir(parents=True, exist_ok=True)
    for name in ("state.json", "optimizer.safetensors"):
        shutil.copy(source / name, target / name)
    shutil.copy(args.src / "training/tokens.npy", args.out / "training/tokens.npy")
    save_file({key: params[key].detach().contiguous() for key in weights}, str(target / "weights.safetensors"))
    print(json.dumps({"src": str(source), "layers": args.layers, "steps": args.steps, "lr": args.lr,
                      "transfer_error": errors, "train_seconds": round(time.time() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
