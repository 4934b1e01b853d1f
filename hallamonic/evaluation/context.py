"""Bits per token on held-out text at several context lengths, and loss by position.

The claim under test is "no positional limit": a model that uses long context gets lower loss
late in a window, one that breaks past its RoPE window gets higher loss there. Windows are
non-overlapping cuts of one token stream, so every length sees the same text.
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from hallamonic.evaluation.scoring import run_guard, score_tokens, unless_out_of_memory

LN2 = math.log(2.0)


def token_stream(tokenizer, texts: list[str]) -> list[int]:
    """All documents as one stream of ids, EOS between documents (when the tokenizer has one)."""
    stream: list[int] = []
    for i, text in enumerate(texts):
        if i and tokenizer.eos_token_id is not None:
            stream.append(tokenizer.eos_token_id)
        stream.extend(tokenizer.encode(text, add_special_tokens=False))
    return stream


def window_prefix(tokenizer) -> list[int]:
    """[BOS] when the tokenizer adds one by default (Llama): windows start as the model expects."""
    probe = tokenizer.encode("a")
    bos = tokenizer.bos_token_id
    return [bos] if bos is not None and probe and probe[0] == bos else []


def bucket_edges(length: int) -> list[int]:
    """0, 1K, 2K, 4K, ... capped at `length`: finer where loss changes fastest."""
    edges, edge = [0], 1024
    while edge < length:
        edges.append(edge)
        edge *= 2
    return edges + [length]


def evaluate_length(model, windows: list[list[int]], length: int, progress: bool) -> tuple[float, dict, int]:
    """(mean bits/token, bits by position bucket, predicted tokens) over windows of one length."""
    edges = bucket_edges(length)
    sums = torch.zeros(len(edges) - 1, dtype=torch.float64)  # nats per bucket
    counts = torch.zeros(len(edges) - 1, dtype=torch.long)
    for window in tqdm(windows, desc=f"context {length}", unit="window", disable=not progress):
        nll, _ = score_tokens(model, torch.tensor([window]))  # (1, L-1): targets at positions 1..L-1
        nll = nll[0].double()  # (L-1,)
        for b in range(len(edges) - 1):
            lo, hi = max(edges[b], 1) - 1, edges[b + 1] - 1  # target position p -> index p-1
            sums[b] += nll[lo:hi].sum()
            counts[b] += hi - lo
    total = int(counts.sum())
    by_position = {
        f"{edges[b]}-{edges[b + 1]}": float(sums[b] / counts[b] / LN2) for b in range(len(edges) - 1) if counts[b]
    }
    return float(sums.sum() / total / LN2), by_position, total


def evaluate_context(
    model,
    tokenizer,
    texts: list[str],
    lengths: list[int],
    *,
    limit: int | None = None,
    max_attention_length: int | None = None,
    progress: bool = True,
) -> dict:
    """Bits per token per context length; lengths that cannot run are listed under `not_run`."""
    prefix = window_prefix(tokenizer)
    stream = token_stream(tokenizer, texts)
    result = {"task": "context", "bits_per_token": {}, "by_position": {}, "tokens": {}, "windows": {}, "not_run": {}}
    failed: str | None = None  # once a length runs out of memory, longer ones will too
    for length in sorted(lengths):
        key, body = str(length), length - len(prefix)
        n_windows = len(stream) // body
        if limit:
            n_windows = min(n_windows, limit)
        reason = failed or run_guard(model, length, max_attention_length)
        if n_windows == 0:
            reason = f"held-out text has only {len(stream)} tokens"
        if reason:
            result["not_run"][key] = reason
            continue
        windows = [prefix + stream[i * body : (i + 1) * body] for i in range(n_windows)]
        measured = unless_out_of_memory(lambda: evaluate_length(model, windows, length, progress))
        if measured is None:
            failed = result["not_run"][key] = "out of memory"
            continue
        bits, by_position, tokens = measured
        result["bits_per_token"][key] = bits
        result["by_position"][key] = by_position
        result["tokens"][key] = tokens
        result["windows"][key] = n_windows
    return result
