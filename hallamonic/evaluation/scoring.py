"""Per-token next-token loss and greedy hits for any causal LM, without (L, vocab) fp32 logits.

At L = 65,536 and a 49,152-token vocabulary the full fp32 logits alone are 12.9 GB, so we run
the decoder trunk once, then apply the LM head to slices of the final hidden states.
Every task (LAMBADA, context, passkey) scores through `score_tokens`, so all models are
measured by the same code.
"""

from __future__ import annotations

import torch
from torch import nn

# Configs with any of these post-process logits after the LM head; slicing the head would skip it.
_LOGIT_POSTPROCESS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")
# Hallamonic trunks take `chunk_size`: past this length, carry the states chunk to chunk so the
# activation memory stays that of one chunk (results are identical to one pass).
RECURRENT_CHUNK = 8192


def is_recurrent(model) -> bool:
    """Hallamonic checkpoints have O(L) memory: no window to respect, no attention to fit."""
    return getattr(model.config, "model_type", "") == "hallamonic"


def reset_dynamic_rope(model: nn.Module) -> None:
    """Make dynamic-NTK RoPE depend on the current sequence only.

    transformers keeps the frequencies of the longest sequence seen so far until a sequence
    shorter than the original window comes by; resetting before each forward makes the result
    of a window independent of what ran before it.
    """
    for module in model.modules():
        rope_type = getattr(module, "rope_type", None)
        if isinstance(rope_type, str) and "dynamic" in rope_type and hasattr(module, "original_inv_freq"):
            module.register_buffer("inv_freq", module.original_inv_freq.clone(), persistent=False)
            module.max_seq_len_cached = module.original_max_seq_len


def _trunk_and_head(model):
    """(trunk, head) when logits are exactly head(trunk(x).last_hidden_state), else None."""
    if any(getattr(model.config, key, None) for key in _LOGIT_POSTPROCESS):
        return None
    trunk = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if trunk is None or trunk is model or not isinstance(head, nn.Linear):
        return None
    return trunk, head


def _final_hidden_or_logits(model, input_ids: torch.Tensor) -> tuple[torch.Tensor, nn.Module | None]:
    """Run the model once; return final hidden states and the head, or logits and None."""
    pair = _trunk_and_head(model)
    if pair is not None:
        trunk, head = pair
        extra = {"chunk_size": RECURRENT_CHUNK} if is_recurrent(model) and input_ids.shape[1] > RECURRENT_CHUNK else {}
        out = trunk(input_ids=input_ids, use_cache=False, **extra)
        hidden = getattr(out, "last_hidden_state", None)
        if hidden is not None:
            return hidden, head  # (B, L, H)
    return model(input_ids=input_ids, use_cache=False).logits, None  # (B, L, V)


def with_copy_cache(model, logits: torch.Tensor, input_ids: torch.Tensor, predictions: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Logits (B, S, V) of positions lo..hi-1 of input_ids (B, L) with the model's copy cache applied
    (its (B, L, K) `predictions` over the whole sequence). Checkpoints from before the context-word
    cue ship heads without it."""
    if getattr(model.copy_cache, "seen_gate", None) is not None:
        return model.copy_cache(logits, predictions[:, lo:hi], model.copy_cache_counts(input_ids, start=lo, stop=hi))
    return model.copy_cache(logits, predictions[:, lo:hi])


@torch.no_grad()
def score_tokens(
    model, input_ids: torch.Tensor, *, start: int = 0, slice_len: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score every next-token prediction from position `start` on.

    input_ids: (B, L). Position t predicts token t+1, so the result covers predictions
    t = start .. L-2: returns (nll, hit), both (B, L-1-start), nll in nats (fp32), hit = the
    greedy argmax equals the true next token.
    """
    reset_dynamic_rope(model)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    states, head = _final_hidden_or_logits(model, input_ids)  # (B, L, H) or (B, L, V)
    # A copy cache (Hallamonic's optional n-gram recall) post-processes the head's logits: apply it
    # slice by slice too. (Without the trunk / head split the model's forward has applied it.)
    copy_cache = getattr(model, "copy_cache", None) if head is not None else None
    predictions = model.copy_cache_predictions(input_ids) if copy_cache is not None else None  # (B, L, K)
    targets = input_ids[:, 1:]  # (B, L-1)
    nll_parts, hit_parts = [], []
    for lo in range(start, input_ids.shape[1] - 1, slice_len):
        hi = min(lo + slice_len, input_ids.shape[1] - 1)
        chunk = states[:, lo:hi]  # (B, S, H|V)
        logits = (head(chunk) if head is not None else chunk).float()  # (B, S, V)
        if copy_cache is not None:
            logits = with_copy_cache(model, logits, input_ids, predictions, lo, hi)
        tgt = targets[:, lo:hi]  # (B, S)
        picked = logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # (B, S)
        nll_parts.append((torch.logsumexp(logits, dim=-1) - picked).cpu())
        hit_parts.append((logits.argmax(dim=-1) == tgt).cpu())
    return torch.cat(nll_parts, dim=1), torch.cat(hit_parts, dim=1)


def position_limit(model) -> int | None:
    """Longest input a model can take at all: learned absolute positions stop at their table.

    RoPE models can run past their training window (that is what the baselines measure), and
    recurrent models have no limit; both return None.
    """
    config = model.config
    if is_recurrent(model) or getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None):
        return None
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def run_guard(model, length: int, max_attention_length: int | None) -> str | None:
    """Why a window of `length` tokens must not run on this model, or None if it may."""
    limit = position_limit(model)
    if limit is not None and length > limit:
        return f"longer than the model's {limit} position embeddings"
    if max_attention_length and not is_recurrent(model) and length > max_attention_length:
        return f"longer than --max-attention-length {max_attention_length}"
    return None


def is_out_of_memory(err: BaseException) -> bool:
    """Both CUDA OOM and the CPU allocator's failure count as 'does not fit'."""
    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def unless_out_of_memory(run):
    """``run()``'s value, or None when it does not fit in memory (CUDA cache emptied); any other
    error propagates. Tasks use it to mark a length 'out of memory' and skip longer ones."""
    try:
        return run()
    except (RuntimeError, torch.OutOfMemoryError) as err:
        if not is_out_of_memory(err):
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None
