"""Where does the converted SmolLM2 lose LAMBADA? Score the teacher with its attention swapped for
the converted model's HarmonicBlocks in some layers only (the other layers keep softmax attention).

The converted model's norms, MLPs and embeddings are the teacher's own, frozen (no LoRA in the
scored run), so swapping every layer reproduces the converted model, and swapping none the teacher.

Usage: python swap.py CONVERTED_DIR LAYERS [LAYERS ...] [--limit 300]
LAYERS: "all", "none", "A-B" (inclusive) or comma lists such as "0-4,20-29"; "converted" scores the
converted model itself (a check that "all" reproduces it).
Appends one line per LAYERS to results.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.phases import BlockAsAttention
from hallamonic.convert.pipeline import _transfer_probe
from hallamonic.convert.recipe import load_recipe
from hallamonic.evaluation.data import lambada_texts
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

HERE = Path(__file__).parent
LAMBADA = HERE / "../../../../shared/data/lambada_openai_dev1000.jsonl"
TOKENS = "outputs/smollm2-n64/training/tokens.npy"  # a conversion's token cache (evals/smollm2_selective.sh)


def conversion_data(tokenizer):
    """(the bundled recipe, its training tokens, its held-out transfer probe), as the pipeline
    builds them: what the retrain / recall / position scripts fit and measure on."""
    recipe = load_recipe("smollm2-135m", [f"base.model={smollm2_gguf_path()}", "data.path=../shared/data/fineweb_train.jsonl"])
    tokens = np.load(TOKENS)
    probe, _ = _transfer_probe(recipe, tokens, tokenizer)
    return recipe, tokens, probe


def parse_layers(text: str, count: int) -> list[int]:
    if text == "all":
        return list(range(count))
    if text == "none":
        return []
    layers: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        layers += range(int(lo), int(hi or lo) + 1)
    return layers


def swappable_teacher(converted: str):
    """(teacher, tokenizer, converted model, swap): ``swap(layers)`` puts the converted model's
    blocks into the teacher at ``layers`` and the teacher's own attention back everywhere else."""
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    student, _ = load_causal_lm(converted)
    attentions = [layer.self_attn for layer in teacher.model.layers]
    blocks = [BlockAsAttention(layer.mixer) for layer in student.model.layers]

    def swap(layers: set[int]) -> None:
        for i, layer in enumerate(teacher.model.layers):
            layer.self_attn = blocks[i] if i in layers else attentions[i]

    return teacher, tokenizer, student, swap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("converted")
    parser.add_argument("layers", nargs="+")
    parser.add_argument("--limit", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(2)
    teacher, tokenizer, student, swap = swappable_teacher(args.converted)
    texts = lambada_texts(LAMBADA, args.limit)
    for spec in args.layers:
        swapped = set(parse_layers(spec, len(teacher.model.layers))) if spec != "converted" else set()
        swap(swapped)
        start = time.time()
        with torch.no_grad():
            result = evaluate_lambada(student if spec == "converted" else teacher, tokenizer, texts, progress=False)
        row = {"converted": args.converted, "swapped": spec, "layers": sorted(swapped), **result,
               "seconds": round(time.time() - start, 1)}
        print(json.dumps(row), flush=True)
        with open(HERE / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
