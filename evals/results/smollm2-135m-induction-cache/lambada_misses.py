"""Which LAMBADA passages a model misses, and how: per passage the target's pieces, the rank and
log-probability of its first piece, whether the later pieces are all greedy, whether the target
word occurs earlier in the passage, and the model's own first choice; then a summary against the
teacher (same passages, scored the same way).

Why: the accuracy alone does not say whether a converted model picks another word of the passage
(recall by meaning: the blocks) or has the word's first piece and loses the rest (a copy the cache
can make): the two need different fixes.

Usage (repository root): python evals/results/smollm2-135m-induction-cache/lambada_misses.py MODEL [--limit 300]
MODEL is a conversion's output folder; the teacher (SmolLM2 GGUF) is scored too. Writes
lambada_misses-NAME.jsonl beside this file (one row per passage, teacher and model)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hallamonic.evaluation.data import lambada_texts
from hallamonic.evaluation.lambada import encode_pair, split_passage
from hallamonic.evaluation.scoring import _final_hidden_or_logits, reset_dynamic_rope, with_copy_cache
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

HERE = Path(__file__).parent
DATA = HERE / "../../../../shared/data/lambada_openai_dev1000.jsonl"


@torch.no_grad()
def passage_rows(spec: str, texts: list[str]) -> list[dict]:
    """One row per passage: the target's first-piece rank / log p, the rest greedy, the first choice."""
    model, tokenizer = load_causal_lm(spec)
    rows = []
    for i, text in enumerate(texts):
        context, target = split_passage(text)
        ctx, tgt = encode_pair(tokenizer, context, target)
        ids = torch.tensor([ctx + tgt])  # (1, L)
        reset_dynamic_rope(model)
        states, head = _final_hidden_or_logits(model, ids)
        logits = (head(states) if head is not None else states).float()  # (1, L, V)
        if head is not None and getattr(model, "copy_cache", None) is not None:  # as score_tokens applies it
            logits = with_copy_cache(model, logits, ids, model.copy_cache_predictions(ids), 0, ids.shape[1])
        log_p = logits[0, len(ctx) - 1 : len(ctx) + len(tgt) - 1].log_softmax(-1)  # (T, V): predictions of the target
        picked = log_p.gather(-1, torch.tensor(tgt)[:, None])[:, 0]  # (T,)
        ranks = (log_p > picked[:, None]).sum(-1)  # (T,)
        rows.append({
            "passage": i, "target": target, "pieces": [tokenizer.decode([t]) for t in tgt],
            "in_context": target.strip() in context, "first_rank": int(ranks[0]), "first_log_p": round(float(picked[0]), 3),
            "rest_greedy": bool((ranks[1:] == 0).all()), "correct": bool((ranks == 0).all()),
            "first_choice": tokenizer.decode([int(log_p[0].argmax())]),
        })
    return rows


def summary(name: str, rows: list[dict]) -> dict:
    n = len(rows)
    return {
        "model": name, "accuracy": round(sum(r["correct"] for r in rows) / n, 4),
        "first_piece_top1": round(sum(r["first_rank"] == 0 for r in rows) / n, 4),
        "first_piece_top5": round(sum(r["first_rank"] < 5 for r in rows) / n, 4),
        "first_right_rest_wrong": sum(r["first_rank"] == 0 and not r["rest_greedy"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--limit", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(2)
    texts = lambada_texts(DATA, args.limit)
    teacher, model = passage_rows(str(smollm2_gguf_path()), texts), passage_rows(args.model, texts)
    name = Path(args.model).name
    with open(HERE / f"lambada_misses-{name}.jsonl", "w") as f:
        for t, m in zip(teacher, model):
            f.write(json.dumps({"passage": t["passage"], "teacher": t, "model": m}) + "\n")
    only_teacher = [m for t, m in zip(teacher, model) if t["correct"] and not m["correct"]]
    print(json.dumps(summary("teacher", teacher)))
    print(json.dumps(summary(name, model)))
    print(json.dumps({
        "both": sum(t["correct"] and m["correct"] for t, m in zip(teacher, model)),
        "only_teacher": len(only_teacher), "only_model": sum(m["correct"] and not t["correct"] for t, m in zip(teacher, model)),
        "only_teacher_target_in_context": sum(m["in_context"] for m in only_teacher),
        "only_teacher_first_piece_right": sum(m["first_rank"] == 0 for m in only_teacher),
        "only_teacher_first_choice_in_context": sum(m["first_choice"].strip() != "" and m["first_choice"].strip() in texts[m["passage"]] for m in only_teacher),
    }))


if __name__ == "__main__":
    main()
