"""Does more attention transfer bring LAMBADA back? Continue phase 1 on some converted blocks.

Takes the converted model's blocks in LAYERS, trains each on the teacher's own attention input ->
output (phase 1's normalised MSE) for STEPS more AdamW steps on 48 x 512 training tokens, puts
them into the teacher (softmax attention in every other layer, as in swap.py) and scores LAMBADA
before and after, with the transfer error on the pipeline's held-out probe tokens.

With --all, also scores the whole converted model (every layer's block, the retrained ones in place).

With --retrieval-weight ALPHA > 0, each position's squared error is weighted 1 + ALPHA * r_t
(rescaled to mean 1 per sequence), where r_t is how sharply the teacher's heads retrieve there: the
mean over heads of the largest attention probability on an earlier token at distance >= 2, the first
token (the attention sink) excluded. It asks whether weighting the transfer toward retrieval events
buys more LAMBADA than the plain normalised MSE.

With --train-text FILE the 48 training sequences come from that text file (tokenized whole, packed
into 512-token sequences, shuffled with seed 0) instead of the conversion's FineWeb token cache: does
the text the recall layers are fitted on matter (FineWeb's legal-leaning web text vs narrative)?

With --student-inputs the input -> output pairs (training and held-out) come from the converted
model with the teacher's attention restored in LAYERS only: the blocks learn what the teacher's
attention does on the inputs the converted layers before them actually give, not on the teacher's
own. (With 20-24 restored, the recipe's converted SmolLM2 gets 0.180 of LAMBADA; with its blocks, 0.070.)
--train-seqs sets how many 512-token training sequences they cycle over (default 48).

Usage: python retrain.py CONVERTED_DIR LAYERS [--steps 180] [--lr 1e-3] [--limit 300] [--all] [--retrieval-weight 0] [--train-text FILE]
       [--student-inputs] [--train-seqs 48]
(needs outputs/smollm2-n64/training/tokens.npy from evals/smollm2_selective.sh). Appends one line to
retrain.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from hallamonic.convert.phases import blocks_in, capture_attention_io
from hallamonic.evaluation.data import lambada_texts
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.loading import load_causal_lm, smollm2_gguf_path
from hallamonic.training.packing import PackedBatches
from swap import HERE, LAMBADA, conversion_data, parse_layers

TRAIN_SEQS, BATCH = 48, 4


def normalised_mse(block, x, y) -> float:
    with torch.no_grad():
        pred = block(x)[0].float()
    return ((pred - y.float()).pow(2).mean() / y.float().pow(2).mean()).item()


def capture(teacher, seqs, layers):
    ins, outs = {i: [] for i in layers}, {i: [] for i in layers}
    for start in range(0, len(seqs), BATCH):
        x, y = capture_attention_io(teacher, seqs[start : start + BATCH])
        for i in layers:
            ins[i].append(x[i])
            outs[i].append(y[i])
    return {i: (torch.cat(ins[i]), torch.cat(outs[i])) for i in layers}


@torch.no_grad()
def retrieval_scores(teacher, seqs, layers) -> dict[int, torch.Tensor]:
    """Per layer, r_t (len(seqs), L): mean over heads of max_{1 <= s <= t-2} A[t, s]."""
    previous = teacher.config._attn_implementation  # eager attention returns its probabilities
    teacher.set_attn_implementation("eager")
    scores = {i: [] for i in layers}
    for start in range(0, len(seqs), BATCH):
        attentions = teacher.model(input_ids=seqs[start : start + BATCH], output_attentions=True, use_cache=False).attentions
        for i in layers:
            probs = attentions[i].float()  # (B, H, L, L)
            length = probs.shape[-1]
            far = torch.ones(length, length, dtype=torch.bool).tril(-2)  # s <= t - 2
            far[:, 0] = False  # the first token: the attention sink, not a retrieval
            peak = probs.masked_fill(~far, 0.0).amax(dim=-1)  # (B, H, L)
            scores[i].append(peak.mean(dim=1))  # (B, L)
    teacher.set_attn_implementation(previous)
    return {i: torch.cat(scores[i]) for i in layers}


def warmup_cosine(opt, steps: int):
    """Warm-up over 10% of ``steps``, then cosine to 0.1 of the peak, like the recipes."""
    warm = max(steps // 10, 1)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / max(steps - warm, 1)))
    )


def train(block, x_all, y_all, steps: int, lr: float, seed: int, w_all=None) -> None:
    params = [p for p in block.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = warmup_cosine(opt, steps)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x_all), (BATCH,), generator=g)
        x, y = x_all[idx], y_all[idx]  # (4, 512, hidden) each
        error = (block(x)[0].float() - y.float()).pow(2)  # (4, 512, hidden)
        if w_all is not None:  # per-position weights, mean 1 per sequence: (4, 512, 1)
            error = error * w_all[idx].unsqueeze(-1)
        loss = error.mean() / y.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("converted")
    parser.add_argument("layers")
    parser.add_argument("--steps", type=int, default=180)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--all", action="store_true", help="also score the whole converted model after retraining")
    parser.add_argument("--train-text", help="fit on sequences of this text file instead of the FineWeb token cache")
    parser.add_argument("--retrieval-weight", type=float, default=0.0, help="ALPHA: weight positions 1 + ALPHA * r_t (see above)")
    parser.add_argument("--student-inputs", action="store_true", help="fit on the converted model's inputs to LAYERS (see above)")
    parser.add_argument("--train-seqs", type=int, default=TRAIN_SEQS, help="512-token training sequences to cycle over")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    teacher.requires_grad_(False)
    student, _ = load_causal_lm(args.converted)
    layers = parse_layers(args.layers, len(teacher.model.layers))
    _, tokens, probe = conversion_data(tokenizer)
    train_tokens = tokens
    if args.train_text:
        text = open(args.train_text, encoding="utf-8-sig").read()
        train_tokens = np.array(tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int64)
    train_seqs = PackedBatches(train_tokens, 512, seed=0).sequences[: args.train_seqs]
    others = [i for i in range(len(teacher.model.layers)) if i not in layers]
    # --student-inputs: the converted model, with the teacher's attention in LAYERS only
    with blocks_in(teacher, student, others if args.student_inputs else []):
        train_io = capture(teacher, train_seqs, layers)
        weights = {i: None for i in layers}
        if args.retrieval_weight > 0:
            for i, r in retrieval_scores(teacher, train_seqs, layers).items():
                w = 1.0 + args.retrieval_weight * r  # (48, 512)
                weights[i] = w / w.mean(dim=1, keepdim=True)
                print(f"layer {i}: r_t mean {r.mean():.3f}, p90 {r.quantile(0.9):.3f}; weight max {weights[i].max():.2f}", flush=True)
        held = capture(teacher, probe, layers)
    texts = lambada_texts(LAMBADA, args.limit)

    def score(swapped=layers) -> dict:
        with torch.no_grad(), blocks_in(teacher, student, swapped):
            result = evaluate_lambada(teacher, tokenizer, texts, progress=False)
        return {k: result[k] for k in ("accuracy", "perplexity", "n")}

    blocks = {i: student.model.layers[i].mixer.float().train().requires_grad_(True) for i in layers}
    before = {"lambada": score(), "mse": {i: normalised_mse(blocks[i], *held[i]) for i in layers}}
    print(json.dumps({"before": before}), flush=True)
    start = time.time()
    for i in layers:
        train(blocks[i], *train_io[i], steps=args.steps, lr=args.lr, seed=i, w_all=weights[i])
    after = {"lambada": score(), "mse": {i: normalised_mse(blocks[i], *held[i]) for i in layers}}
    if args.all:
        with torch.no_grad():
            after["lambada_all_layers"] = score(range(len(teacher.model.layers)))
    row = {"converted": args.converted, "layers": args.layers, "steps": args.steps, "lr": args.lr,
           **({"retrieval_weight": args.retrieval_weight} if args.retrieval_weight > 0 else {}),
           **({"train_text": args.train_text} if args.train_text else {}),
           **({"student_inputs": True} if args.student_inputs else {}),
           **({"train_seqs": args.train_seqs} if args.train_seqs != TRAIN_SEQS else {}),
           "before": before, "after": after, "train_seconds": round(time.time() - start, 1)}
    print(json.dumps(row), flush=True)
    with open(HERE / "retrain.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
