"""What does the teacher's copy need from its attention in layers 15-24: positions, or a sharp kernel?

A converted block reads the teacher's own q, k and v but without RoPE, and mixes the past through a
decayed linear kernel (q . k) instead of softmax. This script changes one of those at a time in the
TEACHER itself, with no training: in LAYERS its attention becomes

    nope        softmax over q . k / sqrt(d) without RoPE (positions dropped, kernel kept)
    nope@T      the same with the logits times T (T < 1: a flatter kernel)
    rope@T      RoPE kept, logits times T
    nope~A      softmax without RoPE, logits plus (t - s) log A: a decay A per token of distance,
                the only position signal a converted block has (ALiBi's form)

and the copy probe (`copy_probe.py`'s trials) and the passkey's key tokens are scored. If "nope"
copies, positions are not what the converted blocks lack; how fast the copy fades as T falls
says how sharp a kernel it needs.

Usage: python kernel_probe.py LAYERS VARIANT [VARIANT ...] [--gaps 0,256] [--passkey 1024]
Appends one line per variant to kernel_probe.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import types
from pathlib import Path

import torch

from copy_probe import copy_scores, copy_trials, heldout_stream, record
from hallamonic.evaluation.passkey import evaluate_passkey
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "smollm2-135m-layer-swap"))
from swap import parse_layers  # noqa: E402


def attention_variant(rope: bool, temperature: float, decay: float = 1.0):
    """A LlamaAttention.forward replacement: causal softmax over the same projections, RoPE
    optional, logits scaled by `temperature`, plus (t - s) log `decay` (no cache: scoring only)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
        batch, length, _ = hidden_states.shape
        shape = (batch, length, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)  # (B, Hq, L, d)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)  # (B, Hkv, L, d)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)  # (B, Hkv, L, d)
        if rope:
            q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, Hq, L, d)
        logits = (q @ k.transpose(-1, -2)) * (temperature / math.sqrt(self.head_dim))  # (B, Hq, L, L)
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        if decay < 1.0:
            pos = torch.arange(length, device=q.device, dtype=logits.dtype)
            logits = logits + (pos[:, None] - pos[None, :]) * math.log(decay)  # (L, L) distance penalty
        weights = logits.masked_fill(~causal, float("-inf")).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, -1)  # (B, L, Hq * d)
        return self.o_proj(out), None

    return forward


def parse_variant(text: str) -> tuple[bool, float, float]:
    name, _, decay = text.partition("~")
    name, _, temp = name.partition("@")
    if name not in ("nope", "rope"):
        raise SystemExit(f"unknown variant {text!r}: nope, nope@T, rope@T, nope~A")
    return name == "rope", float(temp or 1.0), float(decay or 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers")
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--gaps", default="0,256")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--passkey", default="1024", help="passkey lengths (comma list, 10 trials); empty: none")
    args = parser.parse_args()
    torch.set_num_threads(2)
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    stream = heldout_stream(tokenizer)
    attentions = [layer.self_attn for layer in teacher.model.layers]
    originals = [type(a).forward for a in attentions]
    layers = parse_layers(args.layers, len(attentions))
    for spec in args.variants:
        rope, temperature, decay = parse_variant(spec)
        for i, attention in enumerate(attentions):
            chosen = attention_variant(rope, temperature, decay) if i in layers else originals[i]
            attention.forward = types.MethodType(chosen, attention)
        start = time.time()
        row = {"layers": args.layers, "variant": spec}
        with torch.no_grad():
            for gap in [int(g) for g in args.gaps.split(",")]:
                scores = copy_scores(teacher, copy_trials(stream, gap, args.trials))
                row[f"gap{gap}"] = {"second_nll": scores["second_nll"], "second_hit": scores["second_hit"],
                                    "first_nll": scores["first_nll"]}
            if args.passkey:
                lengths = [int(n) for n in args.passkey.split(",")]
                result = evaluate_passkey(teacher, tokenizer, lengths, trials=10, progress=False)
                row["passkey"] = result["accuracy"]
                row["key_tokens"] = {k: round(v, 3) for k, v in result["key_tokens"].items()}
        row["seconds"] = round(time.time() - start, 1)
        record(row, "kernel_probe.jsonl")


if __name__ == "__main__":
    main()
