"""Does a Hedgehog feature map pay in the refit layer alone? Refit one layer's block of a finished
conversion with a chosen feature map and score the whole converted model.

The recipe's phase2-refit fits layer 23's (identity, q.k) block on the inputs the converted model
gives it and levels off near a normalised MSE of 0.3 whatever the steps, pool or learning rate
(`../smollm2-135m-hallamonic-refit`): a capacity limit, not a budget one. Hedgehog's normalised
read-out recalled better per step in layers 20-24 but cost ~2x a mixer step, too much for every
layer; in one layer it costs little. This script takes the block of LAYER as it stood before the
refit (the end-of-focus checkpoint: phase 2 leaves the focus layers frozen), rebuilds it with
FEATURE_MAP (Hedgehog's maps start at the identity), runs the recipe's refit on it (the bfloat16
teacher with the converted blocks in every other layer gives input and target; 192 x 512 pooled
sequences, 4 a step, AdamW lr 1e-3, 10% warm-up then cosine to 0.1, bf16 autocast with the
scan fp32), puts it into the converted model and scores LAMBADA (first 300) and held-out bits
per token at 1,024 (every window). The transfer error is measured on the pipeline's held-out probe,
as the recipe's report does.

Usage: python refit_probe.py CONVERTED_DIR [--layer 23] [--feature-map hedgehog] [--steps 1500]
           [--hedgehog-dims M] [--pool data|phase2]
--hedgehog-dims M (a multiple of head_dim) widens Hedgehog's map to W: (M, N) per head, 2M features:
the first N rows keep the focus-trained W, the rest start as random rotations (seeded). --pool phase2
cuts the refit's sequences from the run's phase-2 text, as the pipeline's refit does.
Appends one line to results.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn

from hallamonic.convert.phases import attention_transfer_errors, blocks_in, capture_attention_io
from hallamonic.convert.pipeline import _transfer_probe
from hallamonic.convert.recipe import load_recipe
from hallamonic.evaluation.runner import EvalOptions, evaluate_model, load_inputs
from hallamonic.loading import load_causal_lm, smollm2_gguf_path
from hallamonic.modeling.modeling_hallamonic import HedgehogFeatureMap
from hallamonic.training.recipe import PhaseSection
from hallamonic.training.trainer import learning_rate

HERE = Path(__file__).parent
SHARED = HERE / "../../../../shared/data"
POOL, SEQ, BATCH = 192, 512, 4


def focus_weights(converted: Path, layer: int) -> dict[str, torch.Tensor]:
    """The block of ``layer`` at the end of phase1-focus (before phase 2 and the refit)."""
    folder = sorted((converted / "training/checkpoints/phase1-focus").iterdir())[-1]
    prefix = f"model.layers.{layer}.mixer."
    return {k[len(prefix) :]: v for k, v in load_file(folder / "weights.safetensors").items() if k.startswith(prefix)}


def rebuilt_block(student, layer: int, feature_map: str, weights: dict[str, torch.Tensor]):
    config = copy.deepcopy(student.config)
    config.feature_map = feature_map
    block = type(student.model.layers[layer].mixer)(config, layer)
    missing, unexpected = block.load_state_dict(weights, strict=False)
    assert not unexpected and all("features" in k for k in missing), (missing, unexpected)
    return block.float()


class WideHedgehog(HedgehogFeatureMap):
    """Hedgehog's map with M >= N projected dims: W (h, M, N), 2M features. Rows [:N] take the given
    (trained) W; each further block of N rows starts as a random rotation, so the extra features
    peak along other directions of the query / key."""

    def __init__(self, trained: torch.Tensor, dims: int, seed: int = 0):
        nn.Module.__init__(self)
        heads, size, _ = trained.shape
        g = torch.Generator().manual_seed(seed)
        extra = [torch.linalg.qr(torch.randn(size, size, generator=g))[0] for _ in range(dims // size - 1)]
        rows = torch.cat([trained] + [q.expand(heads, size, size) for q in extra], dim=1)  # (h, M, N)
        self.weight = nn.Parameter(rows.contiguous())


def widen(block, dims: int) -> None:
    """Swap the block's Hedgehog maps for WideHedgehog ones with ``dims`` projected dims."""
    block.write_features = WideHedgehog(block.write_features.weight.detach(), dims)
    block.read_features = WideHedgehog(block.read_features.weight.detach(), dims)
    block.features = 2 * dims


def capture_pool(hybrid, seqs: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    ins, outs = [], []
    for start in range(0, len(seqs), BATCH):
        x, y = capture_attention_io(hybrid, seqs[start : start + BATCH])
        ins.append(x[layer])
        outs.append(y[layer])
    return torch.cat(ins), torch.cat(outs)  # (POOL, SEQ, hidden) each, bf16


def refit(block, x_all, y_all, steps: int, lr: float) -> list[float]:
    params = list(block.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    section = PhaseSection(steps=steps, lr=lr, warmup_steps=max(steps // 10, 1))  # the refit's schedule in the recipe
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, section)
        idx = torch.randint(0, len(x_all), (BATCH,), generator=g)
        x, y = x_all[idx].float(), y_all[idx].float()  # (4, 512, hidden)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            prediction = block(x)[0]
        loss = (prediction.float() - y).pow(2).mean() / y.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 99:
            print(f"step {step + 1}: loss {np.mean(losses[-100:]):.4f}", flush=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("converted", type=Path)
    parser.add_argument("--layer", type=int, default=23)
    parser.add_argument("--feature-map", default="hedgehog", choices=["identity", "hedgehog"])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hedgehog-dims", type=int, default=None)
    parser.add_argument("--pool", choices=["data", "phase2"], default="data")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    teacher = teacher.to(torch.bfloat16).requires_grad_(False)
    student, _ = load_causal_lm(str(args.converted))
    student.requires_grad_(False)
    tokens = np.load(args.converted / "training/tokens.npy")
    pool_tokens = np.load(args.converted / "training/tokens-phase2.npy") if args.pool == "phase2" else tokens
    seqs = torch.from_numpy(pool_tokens[: POOL * SEQ].astype(np.int64)).view(POOL, SEQ)
    recipe = load_recipe("smollm2-135m", [f"base.model={smollm2_gguf_path()}", f"data.path={SHARED / 'fineweb_train.jsonl'}"])
    held, _ = _transfer_probe(recipe, tokens, tokenizer)  # the pipeline's held-out probe (2 x 512 tokens)
    block = rebuilt_block(student, args.layer, args.feature_map, focus_weights(args.converted, args.layer))
    if args.hedgehog_dims:
        widen(block, args.hedgehog_dims)
    student.model.layers[args.layer].mixer = block
    others = [i for i in range(len(student.model.layers)) if i != args.layer]
    start = time.time()
    with blocks_in(teacher, student, others) as hybrid:
        x_all, y_all = capture_pool(hybrid, seqs, args.layer)
        before = attention_transfer_errors(student, hybrid, held, [args.layer])[0]
        print(f"captured {POOL} sequences in {time.time() - start:.0f} s; error before {before:.3f}", flush=True)
        block.train().requires_grad_(True)
        fit_start = time.time()
        losses = refit(block, x_all, y_all, args.steps, args.lr)
        fit_seconds = time.time() - fit_start
        block.eval().requires_grad_(False)
        after = attention_transfer_errors(student, hybrid, held, [args.layer])[0]
    del x_all, y_all
    print(f"refit {fit_seconds:.0f} s; error {before:.3f} -> {after:.3f}", flush=True)
    scores = {}
    for task, data, extra in (("lambada", "lambada_openai_dev1000.jsonl", {"limit": 300}),
                              ("context", "fineweb_edu_head_heldout.txt", {"lengths": [1024]})):
        options = EvalOptions(task=task, data=str(SHARED / data), progress=False, **extra)
        with torch.no_grad():
            scores[task] = evaluate_model(student, tokenizer, options, load_inputs(options))
    row = {
        "converted": str(args.converted), "layer": args.layer, "feature_map": args.feature_map,
        "hedgehog_dims": args.hedgehog_dims, "pool": args.pool,
        "steps": args.steps, "lr": args.lr, "refit_seconds": round(fit_seconds, 1),
        "error_before": round(before, 4), "error_after": round(after, 4),
        "train_loss_last100": round(float(np.mean(losses[-100:])), 4),
        "lambada": {k: scores["lambada"][k] for k in ("accuracy", "perplexity", "n")},
        "bits_1024": scores["context"]["bits_per_token"]["1024"],
    }
    print(json.dumps(row), flush=True)
    with open(HERE / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
