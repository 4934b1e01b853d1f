"""Does the copy cache make greedy generation loop? A cache that raises "what followed this last
time" could lock greedy decoding into repeating itself. Greedy continuations (``generate``, the
models' own recurrent caches) of held-out prompts, scored by the share of generated 4-grams that
already occurred earlier in the prompt + continuation.

Usage: python repetition.py MODEL [MODEL ...] [--prompts 8] [--new 64] [--repetition-penalty 1.0]
MODEL: a converted folder (with or without a copy cache) or "teacher".
Appends one line per model to repetition.jsonl; prints the first continuation of each.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from hallamonic.loading import load_causal_lm, smollm2_gguf_path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "smollm2-135m-copy"))
from copy_probe import heldout_stream  # noqa: E402


def repeated_share(seq: list[int], start: int, n: int = 4) -> float:
    """Share of the n-grams ending at positions >= start that occurred earlier in seq."""
    seen, repeats, total = set(), 0, 0
    for end in range(n, len(seq) + 1):
        gram = tuple(seq[end - n : end])
        if end - 1 >= start:
            total += 1
            repeats += gram in seen
        seen.add(gram)
    return repeats / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=96)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="generate's repetition_penalty (1 = off)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    for spec in args.models:
        model, tokenizer = load_causal_lm(str(smollm2_gguf_path()) if spec == "teacher" else spec)[:2]
        model.eval()
        held = heldout_stream(tokenizer)
        rng = random.Random(0)
        starts = [rng.randrange(len(held) - args.prompt_length) for _ in range(args.prompts)]
        prompts = [held[s : s + args.prompt_length] for s in starts]
        began = time.time()
        outs = []
        with torch.no_grad():
            for prompt in prompts:
                ids = torch.tensor([prompt])
                out = model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                                     repetition_penalty=args.repetition_penalty, pad_token_id=tokenizer.eos_token_id)
                outs.append(out[0].tolist())
        shares = [repeated_share(o, len(p)) for o, p in zip(outs, prompts)]
        row = {"model": spec, "prompts": len(prompts), "new_tokens": args.new}
        if args.repetition_penalty != 1.0:
            row["repetition_penalty"] = args.repetition_penalty
        row |= {"repeated_4gram_share": round(sum(shares) / len(shares), 3), "per_prompt": [round(s, 2) for s in shares],
                "first_continuation": tokenizer.decode(outs[0][len(prompts[0]) :]), "seconds": round(time.time() - began, 1)}
        print(json.dumps(row), flush=True)
        with open(HERE / "repetition.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
