"""Phase 1's teacher pass in float32 vs bfloat16: time, and how far apart the attention I/O is.

Phase 1 runs the frozen teacher once per step to capture every layer's attention input and output
(`capture_attention_io`); `phase1.teacher_dtype: bfloat16` runs that pass on a bfloat16 copy. This
script times both passes on the same batch, alternated in one process (so CPU speed drift hits
both alike), and prints, per layer, the normalised MSE between the two captures: what the bfloat16
targets cost in accuracy, to be read against the blocks' own transfer error (~0.15 at the end of
phase 1 on SmolLM2).

Usage: python benchmarks/teacher_dtype.py [--model GGUF_OR_FOLDER] [--batch 4] [--seq-len 512] [--rounds 4]
(default model: the offline SmolLM2-135M GGUF; text: the shared FineWeb training file).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from hallamonic.convert.data import tokenize_stream
from hallamonic.convert.phases import capture_attention_io
from hallamonic.convert.recipe import DataSection
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

TEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fineweb_train.jsonl"


def batch_of_text(tokenizer, batch: int, seq_len: int) -> torch.Tensor:
    """(batch, seq_len) tokens of the first FineWeb training documents, read and packed as a conversion does."""
    tokens = tokenize_stream(tokenizer, DataSection(path=str(TEXT)), seed=0, max_tokens=batch * seq_len)
    return torch.from_numpy(tokens.astype("int64")).view(batch, seq_len)


def normalised_mse(a: torch.Tensor, reference: torch.Tensor) -> float:
    return ((a.float() - reference.float()).pow(2).mean() / reference.float().pow(2).mean()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="teacher (default: the SmolLM2-135M GGUF)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fp32, tokenizer = load_causal_lm(args.model or str(smollm2_gguf_path()))
    fp32.eval().requires_grad_(False)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    ids = batch_of_text(tokenizer, args.batch, args.seq_len)
    seconds: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    captures = {}
    for _ in range(args.rounds):
        for name, model in (("float32", fp32), ("bfloat16", bf16)):
            start = time.perf_counter()
            captures[name] = capture_attention_io(model, ids)
            seconds[name].append(time.perf_counter() - start)
    print(f"teacher pass, {args.batch} x {args.seq_len} tokens, median of {args.rounds} alternated rounds:")
    for name, values in seconds.items():
        print(f"  {name:9s} {statistics.median(values):7.3f} s   ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"  float32 / bfloat16: {statistics.median(seconds['float32']) / statistics.median(seconds['bfloat16']):.2f}x")
    (x32, y32), (x16, y16) = captures["float32"], captures["bfloat16"]
    print("normalised MSE of the bfloat16 capture to the float32 one, per layer (input / output):")
    for layer in range(len(x32)):
        print(f"  layer {layer:2d}: {normalised_mse(x16[layer], x32[layer]):.1e} / {normalised_mse(y16[layer], y32[layer]):.1e}")


if __name__ == "__main__":
    main()
