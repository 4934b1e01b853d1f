"""Where in a sequence do the converted blocks miss the teacher? Transfer error by position.

For every layer, feeds the teacher's own attention input to the converted block and compares its
output with the teacher's attention output, split by position: [0, 8), [8, 32), [32, 128),
[128, 512). Per bucket it prints the normalised MSE (squared error / the teacher output's mean
square, in that bucket) and the output scale (RMS of the block's output / RMS of the teacher's).
Two texts: the pipeline's held-out probe (2 x 512 tokens) and the first 64 LAMBADA passages, each
run alone (they end before 128 tokens, so their last bucket is empty).

Usage: python positions.py CONVERTED_DIR OUT.json (needs outputs/smollm2-n64/training/tokens.npy, as retrain.py).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from hallamonic.convert.phases import capture_attention_io
from hallamonic.evaluation.data import lambada_texts
from hallamonic.loading import load_causal_lm, smollm2_gguf_path
from swap import LAMBADA, conversion_data

BUCKETS = [(0, 8), (8, 32), (32, 128), (128, 512)]


@torch.no_grad()
def profile(teacher, student, sequences) -> list[list[dict]]:
    """Per layer, per bucket: normalised MSE and the block / teacher output RMS ratio."""
    sums = np.zeros((len(student.model.layers), len(BUCKETS), 3))  # squared error, target, prediction
    for ids in sequences:
        inputs, targets = capture_attention_io(teacher, ids)
        for i, layer in enumerate(student.model.layers):
            prediction, y = layer.mixer(inputs[i])[0].float(), targets[i].float()  # (B, L, hidden) each
            for j, (lo, hi) in enumerate(BUCKETS):
                p, t = prediction[:, lo:hi], y[:, lo:hi]
                sums[i, j] += [(p - t).pow(2).sum().item(), t.pow(2).sum().item(), p.pow(2).sum().item()]
    return [
        [{"nmse": round(e / t, 3), "rms_ratio": round((p / t) ** 0.5, 3)} if t > 0 else None for e, t, p in layer]
        for layer in sums
    ]


def main() -> None:
    converted, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    student, _ = load_causal_lm(converted)
    _, _, probe = conversion_data(tokenizer)
    passages = [tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids for text in lambada_texts(LAMBADA, 64)]
    result = {"converted": converted, "buckets": BUCKETS,
              "heldout_probe": profile(teacher, student, [probe]), "lambada_64": profile(teacher, student, passages)}
    for name in ("heldout_probe", "lambada_64"):
        print(name, "per bucket", BUCKETS, "normalised MSE (RMS ratio)")
        for i, layer in enumerate(result[name]):
            print(f"  layer {i:2d}: " + "  ".join(f"{b['nmse']:.3f} ({b['rms_ratio']:.2f})" if b else "-" for b in layer))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
