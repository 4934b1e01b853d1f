"""More phase-2 training of a converted SmolLM2 on text with repeated spans: does it learn to copy?

`copy_probe.py` shows the converted model does not copy at all (its loss on a span's second
occurrence is no lower than on the first, even right after it), while the teacher does. Phase 2
trains on plain FineWeb-Edu, where exact repeats are rare, so its cross-entropy hardly asks for
copying. This continues phase 2 (the mixers train; norms, MLPs and embeddings stay frozen) on the
phase-2 token stream with `--copies` spans per 1,024-token sequence overwritten by a copy of an
earlier span of the same sequence (32-96 tokens, 0-600 tokens back): the copied tokens are cheap
only to a model that retrieves. `--copies 0` is the control: the same steps on the plain stream.

Usage: python copy_train.py CONVERTED_DIR OUT_DIR [--copies 3] [--steps 150] [--lr 3e-4]
       [--layers 15-24] (train these layers' mixers only, as in swap.py; default all) [--copy-weight 1]
Writes a loadable checkpoint to OUT_DIR (the source's files, new weights) and one line to
copy_train.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hallamonic.convert.phases import compiled_in_place
from hallamonic.loading import load_causal_lm
from hallamonic.training.recipe import PhaseSection
from hallamonic.training.trainer import learning_rate

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "smollm2-135m-layer-swap"))
from swap import parse_layers  # noqa: E402

SEQ_LEN = 1024


def with_copies(seq: np.ndarray, copies: int, rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """(seq with `copies` spans overwritten by an earlier span of itself, bool mask of the copies'
    tokens after their first, the ones a copying model can predict)."""
    seq, copied = seq.copy(), np.zeros(len(seq), dtype=bool)
    for _ in range(copies):
        length = rng.randint(32, 96)
        dst = rng.randint(length + 64, len(seq) - length)
        src = rng.randint(max(0, dst - length - 600), dst - length)
        seq[dst : dst + length] = seq[src : src + length]
        copied[dst + 1 : dst + length] = True
    return seq, copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("converted")
    parser.add_argument("out")
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--layers", default=None)
    parser.add_argument("--copy-weight", type=float, default=1.0, help="loss weight of the copied tokens (others: 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    model, _ = load_causal_lm(args.converted)
    layers = model.model.layers
    chosen = parse_layers(args.layers or "all", len(layers))
    model.requires_grad_(False)
    for i in chosen:
        layers[i].mixer.requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = PhaseSection(steps=args.steps, seq_len=SEQ_LEN, batch_size=1, lr=args.lr)  # phase 2's: 10 warm-up steps, cosine to 0.1x

    stream = np.load(Path(args.converted) / "training" / "tokens-phase2.npy")
    starts = list(range(0, len(stream) - SEQ_LEN, SEQ_LEN))
    rng.shuffle(starts)
    model.train()
    compiled = [layers[i].mixer for i in chosen if i > 0]  # layer 0 reads frozen embeddings: eager
    losses, copy_losses, begin = [], [], time.time()
    with compiled_in_place(compiled):
        for step in range(args.steps):
            start = starts[step % len(starts)]
            seq, copied = with_copies(stream[start : start + SEQ_LEN], args.copies, rng)
            ids = torch.from_numpy(seq.astype(np.int64))[None]  # (1, L)
            for group in opt.param_groups:
                group["lr"] = learning_rate(step, schedule)
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()  # (L-1, V)
            token_loss = F.cross_entropy(logits, ids[0, 1:], reduction="none")  # (L-1,)
            weight = torch.ones_like(token_loss)
            weight[torch.from_numpy(copied[1:])] = args.copy_weight
            loss = (token_loss * weight).sum() / weight.sum()
            copy_losses.append(float(token_loss[torch.from_numpy(copied[1:])].mean()) if copied.any() else float("nan"))
            if not torch.isfinite(loss):
                raise SystemExit(f"step {step}: loss is {loss.item()}; weights left unsaved")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            if step % 10 == 0 or step == args.steps - 1:
                print(f"step {step} loss {loss.item():.4f} copied {np.nanmean(copy_losses[-10:]):.4f} ({time.time() - begin:.0f} s)", flush=True)
    model.eval()

    out = Path(args.out)
    shutil.copytree(args.converted, out, ignore=shutil.ignore_patterns("training", "model.safetensors"), dirs_exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    row = {"converted": args.converted, "out": args.out, "copies": args.copies, "steps": args.steps, "lr": args.lr,
           "layers": args.layers or "all", "copy_weight": args.copy_weight, "seed": args.seed, "loss_first10": round(float(np.mean(losses[:10])), 4),
           "loss_last10": round(float(np.mean(losses[-10:])), 4),
           "copied_first10": round(float(np.nanmean(copy_losses[:10])), 4), "copied_last10": round(float(np.nanmean(copy_losses[-10:])), 4), "seconds": round(time.time() - begin, 1)}
    print(json.dumps(row), flush=True)
    with open(HERE / "copy_train.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
