"""Tiny offline models for evaluation tests: the tests' one tiny BPE (`hallamonic.tiny`) trained
on the shared LAMBADA data, and random Llama models built from `LlamaConfig`, so no test needs the
network."""

from __future__ import annotations

from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
LAMBADA_FILE = DATA / "lambada_openai_dev1000.jsonl"
HELDOUT_FILE = DATA / "fineweb_edu_head_heldout.txt"


def build_tokenizer(bos: bool = True):
    """A 600-token byte-level BPE trained on LAMBADA text (Llama-like: adds <s> by default when `bos`)."""
    from hallamonic.tiny import build_tiny_tokenizer

    text = LAMBADA_FILE.read_text()[:150_000] if LAMBADA_FILE.exists() else "the cat sat on the mat. " * 500
    return build_tiny_tokenizer(600, texts=[text], specials=("<unk>", "<s>", "</s>"), bos_prefix=bos)


def build_llama(vocab_size: int, window: int = 64, seed: int = 0):
    """A 2-layer random Llama whose RoPE window is `window` tokens (so 'past the window' is cheap)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=window,
        rope_theta=10_000.0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the 0.02-std init, so argmaxes and losses vary
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    return model

