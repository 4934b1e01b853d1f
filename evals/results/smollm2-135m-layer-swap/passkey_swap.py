"""Where does the converted SmolLM2 lose the passkey? Passkey retrieval of the teacher with its
attention swapped for the converted model's HarmonicBlocks in some layers only (swap.py's hybrids).

The converted model scores 0/10 at 1K-4K with 0.00-0.05 of the key's tokens right: it has no idea
of the key, at any distance measured. This asks which layers' blocks lose it, and whether the
whole converted model finds the key at shorter distances (the needle within ~100-200 tokens).

Usage: python passkey_swap.py CONVERTED_DIR LAYERS [LAYERS ...] [--lengths 256,1024] [--trials 10]
LAYERS as in swap.py ("all", "none", "A-B", comma lists). Appends one line per LAYERS to
passkey_swap.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hallamonic.evaluation.passkey import evaluate_passkey
from swap import HERE, parse_layers, swappable_teacher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("converted")
    parser.add_argument("layers", nargs="+")
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(2)
    teacher, tokenizer, _, swap = swappable_teacher(args.converted)
    lengths = [int(n) for n in args.lengths.split(",")]
    for spec in args.layers:
        swap(set(parse_layers(spec, len(teacher.model.layers))))
        start = time.time()
        with torch.no_grad():
            result = evaluate_passkey(teacher, tokenizer, lengths, trials=args.trials, progress=False)
        row = {"converted": args.converted, "swapped": spec, "accuracy": result["accuracy"],
               "key_tokens": {k: round(v, 3) for k, v in result["key_tokens"].items()},
               "prompt_tokens": result["prompt_tokens"], "seconds": round(time.time() - start, 1)}
        print(json.dumps(row), flush=True)
        with open(HERE / "passkey_swap.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
