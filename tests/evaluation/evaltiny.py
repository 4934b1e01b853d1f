"""Tiny offline models for evaluation tests: a byte-level BPE trained on the shared data and
random Llama models built from `LlamaConfig`, so no test needs the network."""

from __future__ import annotations

from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
LAMBADA_FILE = DATA / "lambada_openai_dev1000.jsonl"
HELDOUT_FILE = DATA / "fineweb_edu_head_heldout.txt"


def build_tokenizer(bos: bool = True):
    """A 600-token byte-level BPE (Llama-like: adds <s> by default when `bos`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    text = LAMBADA_FILE.read_text()[:150_000] if LAMBADA_FILE.exists() else "the cat sat on the mat. " * 500
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text], trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


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

