"""Can the converted SmolLM2 copy? Next-token loss on a span of text the second time it appears.

The passkey (0/10 at every length, 0.00-0.07 of the key's tokens) asks for one skill: find an
earlier occurrence of the current context and copy what followed it. This measures that skill on
plain held-out FineWeb-Edu, continuously instead of pass/fail: each trial is

    [64 tokens of text] [span A: 32 tokens] [gap: G tokens of other text] [span A again]

and reports, over the second A, the mean NLL (nats/token) and the fraction of tokens that are the
greedy argmax, beside the same numbers over the first A (where copying cannot help). The teacher
copies (its second-A loss falls close to 0); a model that cannot copy scores both A's alike.

Usage: python copy_probe.py MODEL [MODEL ...] [--gaps 0,256,768] [--trials 16]
       python copy_probe.py CONVERTED_DIR --blocks-in LAYERS [LAYERS ...]
MODEL: a converted folder, a .gguf file or "teacher" (the bundled SmolLM2 GGUF). With --blocks-in,
the teacher is scored with the converted model's blocks in LAYERS only (the layer-swap folder's
hybrids; LAYERS as there: "all", "none", "A-B", comma lists).
Appends one line per (model, gap) to copy_probe.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import sys

import torch

from hallamonic.evaluation.data import heldout_texts
from hallamonic.evaluation.scoring import score_tokens
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

HERE = Path(__file__).parent
HELDOUT = HERE / "../../../../shared/data/fineweb_edu_head_heldout.txt"
LEAD, SPAN = 64, 32


def heldout_stream(tokenizer) -> list[int]:
    text = "\n\n".join(heldout_texts(HELDOUT, 0))
    return tokenizer.encode(text, add_special_tokens=False)


def copy_trials(stream: list[int], gap: int, trials: int, seed: int = 0) -> list[list[int]]:
    """Token sequences [lead][A][gap][A], every piece cut from a different place of the stream.
    The same trials for every model (seeded by gap)."""
    rng = random.Random(seed * 1_000_003 + gap)
    out = []
    for _ in range(trials):
        a, b = (rng.randrange(0, len(stream) - LEAD - SPAN - gap) for _ in range(2))
        lead_and_span = stream[a : a + LEAD + SPAN]
        out.append(lead_and_span + stream[b : b + gap] + lead_and_span[LEAD:])
    return out


def copy_scores(model, sequences: list[list[int]]) -> dict:
    """Mean NLL and greedy hit rate over the first and the second occurrence of A."""
    ids = torch.tensor(sequences)  # (T, L): every trial has the same length
    nll, hit = score_tokens(model, ids)  # (T, L-1): position t predicts token t+1
    first = slice(LEAD - 1, LEAD + SPAN - 1)  # predictions of A's first occurrence
    second = slice(ids.shape[1] - SPAN - 1, ids.shape[1] - 1)
    return {
        "first_nll": round(float(nll[:, first].mean()), 3),
        "second_nll": round(float(nll[:, second].mean()), 3),
        "first_hit": round(float(hit[:, first].float().mean()), 3),
        "second_hit": round(float(hit[:, second].float().mean()), 3),
    }


def record(row: dict, name: str) -> None:
    """Print one result row and append it to the JSONL file `name` beside this script."""
    print(json.dumps(row), flush=True)
    with open(HERE / name, "a") as f:
        f.write(json.dumps(row) + "\n")


def load(spec: str):
    return load_causal_lm(str(smollm2_gguf_path()) if spec == "teacher" else spec)


def hybrids(converted: str, specs: list[str]):
    """(name, model, tokenizer) per spec: the teacher with `converted`'s blocks in those layers."""
    sys.path.insert(0, str(HERE.parent / "smollm2-135m-layer-swap"))
    from swap import parse_layers, swappable_teacher

    teacher, tokenizer, _, swap = swappable_teacher(converted)
    for spec in specs:
        swap(set(parse_layers(spec, len(teacher.model.layers))))
        yield f"{converted} blocks in {spec}", teacher, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--blocks-in", nargs="+", default=None)
    parser.add_argument("--gaps", default="0,256,768")
    parser.add_argument("--trials", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.blocks_in:
        models = hybrids(args.models[0], args.blocks_in)
    else:
        models = ((spec, *load(spec)) for spec in args.models)
    for name, model, tokenizer in models:
        stream = heldout_stream(tokenizer)
        for gap in [int(g) for g in args.gaps.split(",")]:
            start = time.time()
            with torch.no_grad():
                row = {"model": name, "gap": gap, "trials": args.trials}
                row |= copy_scores(model, copy_trials(stream, gap, args.trials))
            row["seconds"] = round(time.time() - start, 1)
            record(row, "copy_probe.jsonl")


if __name__ == "__main__":
    main()
