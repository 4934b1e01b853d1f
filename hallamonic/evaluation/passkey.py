"""Passkey retrieval: a number hidden at a random depth in filler text, asked for at the end.

Stable loss alone does not prove that a model uses distant context; retrieving one fact from
anywhere in the window does. The prompt follows Mohtashami & Jaggi (2023, landmark attention).
A trial counts as correct when every token of the key is the greedy argmax given the prompt
and the key's earlier tokens, i.e. exactly when greedy decoding would write the key; scoring
it from one forward needs no generation cache, so it works on any causal LM.
"""

from __future__ import annotations

import random

import torch
from tqdm.auto import tqdm

from hallamonic.evaluation.lambada import encode_pair
from hallamonic.evaluation.scoring import run_guard, score_tokens, unless_out_of_memory

INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there."
)
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"


def build_prompt(n_filler: int, depth: float, key: str) -> str:
    """INTRO, filler with the needle after round(depth * n_filler) units, then the question."""
    before = round(depth * n_filler)
    return INTRO + FILLER * before + NEEDLE.format(key=key) + FILLER * (n_filler - before) + QUESTION


def make_trial(tokenizer, length: int, depth: float, key: str) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) with prompt + answer at most `length` tokens, as close as fits."""
    unit = len(tokenizer.encode(FILLER * 8, add_special_tokens=False)) / 8
    fixed = len(tokenizer.encode(build_prompt(0, 0.0, key))) + 8  # + room for the answer
    n_filler = max(0, int((length - fixed) / unit))
    while True:
        prompt, answer = encode_pair(tokenizer, build_prompt(n_filler, depth, key), " " + key)
        if len(prompt) + len(answer) <= length or n_filler == 0:
            return prompt, answer
        n_filler -= max(1, int((len(prompt) + len(answer) - length) / unit))


def make_trials(tokenizer, length: int, trials: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """The same keys and depths for every model (seeded by length), so models see equal tests."""
    rng = random.Random(seed * 1_000_003 + length)
    return [make_trial(tokenizer, length, rng.random(), str(rng.randint(10_000, 99_999))) for _ in range(trials)]


def key_hits(model, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """(len(answer),) bool: which of the answer's tokens (the key with its leading space) are the
    greedy argmax given all before them.

    All true exactly when greedy decoding after `prompt` would write the key. The fraction true is
    a partial credit that tells "has most of the key" from "has no idea" when every model scores 0
    on the exact match.
    """
    ids = torch.tensor([prompt + answer])  # (1, L)
    _, hit = score_tokens(model, ids, start=len(prompt) - 1)  # (1, len(answer)): the answer's predictions
    return hit[0]


def evaluate_passkey(
    model,
    tokenizer,
    lengths: list[int],
    *,
    trials: int = 5,
    seed: int = 0,
    max_attention_length: int | None = None,
    progress: bool = True,
) -> dict:
    """Accuracy per length over `trials` trials; lengths that cannot run go under `not_run`.

    `accuracy`: the fraction of trials whose whole key greedy decoding would write; `key_tokens`:
    the fraction of the answer's tokens right given the ones before them (teacher-forced partial credit).
    """
    result = {"task": "passkey", "accuracy": {}, "key_tokens": {}, "trials": trials, "prompt_tokens": {}, "not_run": {}}
    failed: str | None = None
    for length in sorted(lengths):
        key = str(length)
        reason = failed or run_guard(model, length, max_attention_length)
        if reason:
            result["not_run"][key] = reason
            continue
        cases = make_trials(tokenizer, length, trials, seed)
        longest = max(len(p) + len(a) for p, a in cases)
        if longest > length:
            result["not_run"][key] = f"shorter than the passkey prompt without filler ({longest} tokens)"
            continue
        hits = unless_out_of_memory(
            lambda: [key_hits(model, p, a) for p, a in tqdm(cases, desc=f"passkey {length}", disable=not progress)]
        )
        if hits is None:
            failed = result["not_run"][key] = "out of memory"
            continue
        result["accuracy"][key] = sum(bool(h.all()) for h in hits) / len(hits)
        result["key_tokens"][key] = sum(h.float().mean().item() for h in hits) / len(hits)
        result["prompt_tokens"][key] = round(sum(len(p) + len(a) for p, a in cases) / len(cases))
    return result
