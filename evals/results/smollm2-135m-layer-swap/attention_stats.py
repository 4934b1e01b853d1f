"""Where does the teacher's attention go? Per layer and head, the mean attention probability on the
previous token (t-1), on itself (t) and on the first token (the attention sink), over positions
2..511 of 4 training sequences of 512 tokens (eager attention). Motivates the short-conv and sink
probes in README.md: a previous-token head is what a short conv gives exactly, and a head that
parks its mass on the first token is what an unnormalised linear attention cannot copy.

Usage: python attention_stats.py [OUT.json]   (default attention_stats.json beside this file)
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from hallamonic.loading import load_causal_lm, smollm2_gguf_path
from hallamonic.training.packing import PackedBatches
from swap import HERE, TOKENS


def main() -> None:
    torch.set_num_threads(2)
    teacher, _ = load_causal_lm(str(smollm2_gguf_path()))
    teacher.set_attn_implementation("eager")  # sdpa does not return the probabilities
    seqs = PackedBatches(np.load(TOKENS), 512, seed=0).sequences[:4]
    with torch.no_grad():
        out = teacher(torch.as_tensor(np.stack([np.asarray(s) for s in seqs])).long(), output_attentions=True)
    rows = []
    for layer, probs in enumerate(out.attentions):  # (B, H, L, L)
        t = torch.arange(2, probs.shape[-1])
        per_head = lambda p: [round(v, 3) for v in p.mean(dim=(0, 2)).tolist()]  # noqa: E731
        row = {"layer": layer, "previous": per_head(probs[:, :, t, t - 1]), "self": per_head(probs[:, :, t, t]),
               "first": per_head(probs[:, :, t, 0])}
        rows.append(row)
        print(f"layer {layer:2d}: previous-token max {max(row['previous']):.2f}, first-token mean "
              f"{sum(row['first']) / len(row['first']):.2f}", flush=True)
    path = sys.argv[1] if len(sys.argv) > 1 else HERE / "attention_stats.json"
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
