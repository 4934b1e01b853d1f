"""What the converted model predicts where the passkey's digits should come (256-token prompts).

The passkey score is 0/10 at every length; this shows whether the key is missing altogether or
lost part-way: greedy and top-5 tokens at each answer position, teacher-forced.

Usage: python evals/results/smollm2-135m-hallamonic-two-level/passkey_probe.py [CONVERTED_DIR]
(default outputs/smollm2-two-level-full); its output is passkey_probe.txt beside this file.
"""

import random
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hallamonic.evaluation.passkey import make_trial


def main(path: str, trials: int = 6, length: int = 256) -> None:
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    rng = random.Random(1)
    in_top5 = total = 0
    for _ in range(trials):
        key = str(rng.randint(10_000, 99_999))
        prompt, answer = make_trial(tokenizer, length, rng.random(), key)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + answer])).logits[0]  # (T, vocab)
        at_answer = logits[len(prompt) - 1 : len(prompt) - 1 + len(answer)]  # (len(answer), vocab)
        top5 = [[tokenizer.decode([t]) for t in row.topk(5).indices.tolist()] for row in at_answer]
        want = [tokenizer.decode([t]) for t in answer]
        print(key, "want", want, "greedy", [row[0] for row in top5])
        print("   top5 per position", top5)
        in_top5 += sum(w.strip() in [t.strip() for t in row] for w, row in zip(want, top5) if w.strip())
        total += sum(1 for w in want if w.strip())
    print(f"key digits in the top 5: {in_top5}/{total}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "outputs/smollm2-two-level-full")
