#!/usr/bin/env python
"""The headline comparison in one command: a model vs its teacher and the teacher's free RoPE
fixes (dynamic NTK, YaRN) on LAMBADA, held-out bits/token by context length, and passkey.

Writes OUT/<task>/results.json + PNG per task and OUT/headline.md with every table, e.g.

    python evals/headline.py --model runs/smollm2-hallamonic --teacher SPEC \\
        --data-dir ../shared/data --out evals/results/smollm2-hallamonic \\
        --lambada-limit 300 --context-lengths 1024,4096,8192,16384 --context-limit 3

`--tasks` picks a subset; `--baselines` defaults to teacher, ntk and yarn.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from hallamonic.evaluation.cli import parse_lengths
from hallamonic.evaluation.report import markdown_table, plot_results, write_results
from hallamonic.evaluation.runner import EvalOptions, run_evaluation
from hallamonic.loading import load_causal_lm


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="converted checkpoint (or any causal LM spec)")
    ap.add_argument("--teacher", help="teacher spec (default: from the checkpoint's config)")
    ap.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tasks", default="lambada,context,passkey")
    ap.add_argument("--baselines", default="teacher,ntk,yarn")
    ap.add_argument("--lambada-limit", type=int)
    ap.add_argument("--context-lengths", default="1024,4096,8192")
    ap.add_argument("--context-limit", type=int, help="windows per length")
    ap.add_argument("--passkey-lengths", default="1024,2048,4096,8192,16384")
    ap.add_argument("--passkey-trials", type=int, default=10)
    ap.add_argument("--max-attention-length", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    per_task = {
        "lambada": dict(data=str(args.data_dir / "lambada_openai_dev1000.jsonl"), limit=args.lambada_limit),
        "context": dict(
            data=str(args.data_dir / "fineweb_edu_head_heldout.txt"),
            limit=args.context_limit,
            lengths=parse_lengths(args.context_lengths),
        ),
        "passkey": dict(lengths=parse_lengths(args.passkey_lengths), trials=args.passkey_trials),
    }
    baselines = [b for b in args.baselines.split(",") if b]
    lines = [f"# Headline: {args.model}", "", "Command:", "", "```", shlex.join(["python", *sys.argv]), "```"]
    for task in [t for t in args.tasks.split(",") if t]:
        options = EvalOptions(task=task, max_attention_length=args.max_attention_length, **per_task[task])
        results = run_evaluation(
            args.model,
            options,
            baselines=baselines,
            teacher=args.teacher,
            load=lambda spec: load_causal_lm(spec, dtype=getattr(torch, args.dtype), device=args.device),
        )
        out = args.out / task
        write_results(results, out)
        plots = plot_results(results, out)
        table = markdown_table(results)
        print(table, flush=True)
        lines += ["", f"## {task}", "", table] + [f"\n![{task}]({task}/{p.name})" for p in plots]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "headline.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'headline.md'}")


if __name__ == "__main__":
    main()
