"""Does a normalised feature map recall better at equal training? Judge block variants by LAMBADA.

The transfer probe (`../smollm2-135m-transfer-probe`) ranked feature maps by phase 1's normalised
MSE only, and the identity map (plain linear attention over q.k) won. But the layer swaps showed the
mean MSE does not predict LAMBADA. This script builds FRESH blocks of each variant for LAYERS from
the teacher's attention (the block's own init, `init_from_attention`, the pipeline's calibration),
trains each on its layer's teacher attention I/O (phase 1's normalised MSE, AdamW, batch 4 x 512,
48 training sequences (--train-seqs) captured once), puts them into the teacher (softmax attention everywhere else)
and scores LAMBADA (first LIMIT passages of the shared dev file, lm-eval protocol).

Variants: those of `../smollm2-135m-transfer-probe/probe.py` (identity/none, elu/den, hedgehog/den,
identity/rms), with its block options after a third slash (e.g. identity/none/short_conv_size=4, identity/none/value_skip=true:
Mamba's D skip, D = 0 at the start). The recipe's delta_layers do not apply: the variant names the rule.

With --into CONVERTED_DIR each variant is also scored in that whole converted model: its own blocks
everywhere but LAYERS, the fresh ones there (the teacher with every layer swapped, as swap.py's "all").

Usage: python recall_probe.py LAYERS VARIANT [VARIANT ...] [--steps 180] [--lr 2e-3] [--limit 300] [--train-seqs 48] [--into DIR]
       [--passkey 256,1024] [--copy-frac 0.5] [--copy]
Option rope=true (e.g. identity/none/rope=true) puts the teacher's RoPE on the block's k and q
(`RotaryMap`); --copy also runs the copy probe of ../smollm2-135m-copy on the hybrid.
(needs outputs/smollm2-n64/training/tokens.npy from evals/smollm2_selective.sh). One line per
variant goes to recall_probe.jsonl beside this file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types

import torch
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from hallamonic.convert.surgery import student_config
from hallamonic.evaluation.data import lambada_texts
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.evaluation.passkey import evaluate_passkey
from hallamonic.loading import load_causal_lm, smollm2_gguf_path
from hallamonic.modeling.modeling_hallamonic import HallamonicPreTrainedModel
from hallamonic.training.packing import PackedBatches
from retrain import TRAIN_SEQS, capture, normalised_mse, train
from swap import HERE, LAMBADA, BlockAsAttention, conversion_data, parse_layers

sys.path.insert(0, str(HERE.parent / "smollm2-135m-transfer-probe"))
from probe import ProbeBlock, parse_variant  # noqa: E402


class RotaryMap(nn.Module):
    """A block's write (k) or read (q) map followed by the teacher's RoPE at positions 0..L-1.

    With identity features and N = head_dim, the decayed linear attention then scores
    a^(t-s) (R_t q_t) . (R_s k_s) = a^(t-s) q_t . R_(s-t) k_s: relative positions as the teacher's
    softmax sees them (RetNet's retention is this form). Experiment only: sequences start at
    position 0 (no cache offset)."""

    def __init__(self, linear: nn.Linear, head_dim: int, rotary: nn.Module):
        super().__init__()
        self.linear, self.head_dim, self.rotary = linear, head_dim, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)  # (B, L, heads * d)
        heads = y.view(*y.shape[:2], -1, self.head_dim)  # (B, L, heads, d)
        positions = torch.arange(y.shape[1], device=y.device).unsqueeze(0)  # (1, L)
        cos, sin = self.rotary(heads, positions)  # (1, L, d) each
        cos, sin = cos.unsqueeze(2).to(y.dtype), sin.unsqueeze(2).to(y.dtype)  # (1, L, 1, d)
        return (heads * cos + rotate_half(heads) * sin).flatten(2)


def fresh_block(config, feature: str, normalise: str, teacher, layer: int, x_cal, y_cal, sink: bool = False, densink: bool = False,
                features: int = 0, rope: bool = False) -> ProbeBlock:
    torch.manual_seed(layer)
    block = ProbeBlock(config, feature, normalise, layer, sink, densink, features)
    for module in block.modules():  # the model's own init (gate timescales, zero up-projections)
        HallamonicPreTrainedModel._init_weights(types.SimpleNamespace(config=config), module)
    block.init_from_attention(teacher.model.layers[layer].self_attn)
    if rope:  # the teacher's rotary positions on the block's k and q (before calibration)
        block.state_write = RotaryMap(block.state_write, config.head_dim, teacher.model.rotary_emb)
        block.state_read = RotaryMap(block.state_read, config.head_dim, teacher.model.rotary_emb)
    if feature == "taylor" and hasattr(block, "fk"):  # Based's projection: the keys' and queries' top directions
        block.set_taylor_basis(x_cal)
    if densink:  # the sink key starts as the teacher's key at the first position (the sink's)
        with torch.no_grad():
            block.sink_key.copy_(block.state_write(x_cal[:, 0]).float().mean(0).view_as(block.sink_key))
    with torch.no_grad():  # the pipeline's calibration
        rms = block.value_stream(x_cal).float().pow(2).mean().sqrt().item()
        for norm in block.error_norms:
            norm.weight.fill_(rms)
        m = block(x_cal)[0].float()
        block.o_proj.weight.mul_((m * y_cal.float()).sum() / (m * m).sum())
    return block


def with_copied_spans(seqs: torch.Tensor, fraction: float, seed: int = 0) -> torch.Tensor:
    """A copy of seqs (N, L) in which the first round(fraction * N) sequences repeat one span of
    their own text later on: 32-64 tokens from the first half written again >= 64 tokens after it.

    Why: on running text the teacher's copy heads rarely get an exact earlier span to match, so an
    output MSE on natural sequences barely asks a block to copy; a repeated span makes the teacher
    copy (induction) inside the very I/O the block regresses. Generic text, not the passkey prompt.
    """
    seqs = seqs.clone()
    g = torch.Generator().manual_seed(seed)
    length = seqs.shape[1]

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=g))

    for row in range(round(fraction * len(seqs))):
        span = draw(32, 65)
        source = draw(1, length // 2 - span)
        target = draw(source + span + 64, length - span + 1)
        seqs[row, target : target + span] = seqs[row, source : source + span]
    return seqs


def teacher_log_probs(attention, rotary, x) -> torch.Tensor:
    """The teacher attention's causal log-probabilities on its inputs x (B, L, hidden): (B, H, L, L)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    batch, length, _ = x.shape
    d = attention.head_dim
    q = attention.q_proj(x).view(batch, length, -1, d).transpose(1, 2)  # (B, H, L, d)
    k = attention.k_proj(x).view(batch, length, -1, d).transpose(1, 2)  # (B, Hkv, L, d)
    cos, sin = rotary(x, torch.arange(length).unsqueeze(0))
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k = repeat_kv(k, q.shape[1] // k.shape[1])  # (B, H, L, d)
    logits = (q.float() @ k.float().transpose(-1, -2)) * d**-0.5  # (B, H, L, L)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, float("-inf")).log_softmax(-1)


def attention_kl(block, attention, rotary, x_all, steps: int, lr: float, seed: int) -> list[float]:
    """Hedgehog's own objective before the output MSE: fit the block's normalised q.k weights
    (feature maps and write / read maps; no decay) to the teacher's attention probabilities by
    KL(teacher || block); with rope=true the block's weights see the teacher's positions too.
    Returns the loss every 25 steps."""
    maps = [getattr(m, "linear", m) for m in (block.state_write, block.state_read)]  # through a RotaryMap
    params = [maps[0].weight, maps[1].weight, block.fk, block.fq]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    causal = None
    losses = []
    for step in range(steps):
        x = x_all[torch.randint(0, len(x_all), (2,), generator=g)]  # (2, 512, hidden)
        with torch.no_grad():
            target = teacher_log_probs(attention, rotary, x)  # (B, H, L, L)
        write, read = block._state_maps(block.state_write(x), block.state_read(x))  # (B, L, H, F) each
        scores = torch.einsum("bthf,bshf->bhts", read, write)  # (B, H, L, L), >= 0
        if causal is None:
            causal = torch.ones(scores.shape[-1], scores.shape[-1], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, 0.0)
        log_student = (scores + 1e-12).log() - scores.sum(-1, keepdim=True).log()
        p = target.exp()
        loss = (p * (target - log_student)).masked_fill(~causal, 0.0).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            losses.append(round(loss.item(), 4))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers")
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--steps", type=int, default=180)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--train-seqs", type=int, default=TRAIN_SEQS, help="training sequences of 512 tokens, captured once")
    parser.add_argument("--passkey", default="", help="also score the hybrid's passkey at these lengths (comma list, 10 trials)")
    parser.add_argument("--copy-frac", type=float, default=0.0,
                        help="fraction of the training sequences that repeat a span of their own text (with_copied_spans)")
    parser.add_argument("--into", help="a converted model folder: also score it with the fresh blocks in LAYERS")
    parser.add_argument("--copy", action="store_true", help="also score the hybrid on ../smollm2-135m-copy/copy_probe.py (gaps 0, 256)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    teacher.requires_grad_(False)
    layers = parse_layers(args.layers, len(teacher.model.layers))
    recipe, tokens, probe = conversion_data(tokenizer)
    train_seqs = PackedBatches(tokens, 512, seed=0).sequences[: args.train_seqs]  # (N, 512)
    train_io = capture(teacher, with_copied_spans(train_seqs, args.copy_frac), layers)
    held = capture(teacher, probe, layers)
    texts = lambada_texts(LAMBADA, args.limit)
    attentions = {i: layer.self_attn for i, layer in enumerate(teacher.model.layers)}
    converted = load_causal_lm(args.into)[0] if args.into else None
    copy_sets = {}  # gap -> the copy probe's trials, built once for every variant
    if args.copy:
        sys.path.insert(0, str(HERE.parent / "smollm2-135m-copy"))
        from copy_probe import copy_scores, copy_trials, heldout_stream

        stream = heldout_stream(tokenizer)
        copy_sets = {gap: copy_trials(stream, gap, 16) for gap in (0, 256)}
    for variant in args.variants:
        start = time.time()
        feature, normalise, harmonic, options = parse_variant(variant, recipe.harmonic)
        config = student_config(teacher, harmonic)
        config.value_skip = options.get("value_skip") == "true"  # D * u into the output, D = 0 at the start
        blocks, mse = {}, {}
        for i in layers:
            x_all, y_all = train_io[i]
            blocks[i] = fresh_block(config, feature, normalise, teacher, i, x_all[:2], y_all[:2], options.get("sink") == "true",
                                   options.get("densink") == "true", int(options.get("features", 0)), options.get("rope") == "true")
            mse[i] = {"calibrated": normalised_mse(blocks[i], *held[i])}
            if "attnkl" in options:  # Hedgehog's attention-weight distillation first
                kl = attention_kl(blocks[i], attentions[i], teacher.model.rotary_emb, x_all, int(options["attnkl"]), args.lr, i)
                mse[i]["attention_kl"] = kl
                mse[i]["after_kl"] = normalised_mse(blocks[i], *held[i])
                print(f"  {variant} layer {i}: attention KL {kl}, error {mse[i]['after_kl']:.3f}", flush=True)
            train(blocks[i], x_all, y_all, steps=args.steps, lr=args.lr, seed=i)
            mse[i]["trained"] = normalised_mse(blocks[i], *held[i])
            print(f"  {variant} layer {i}: {mse[i]['calibrated']:.3f} -> {mse[i]['trained']:.3f}", flush=True)
        for i in layers:
            teacher.model.layers[i].self_attn = BlockAsAttention(blocks[i])
        with torch.no_grad():
            result = evaluate_lambada(teacher, tokenizer, texts, progress=False)
            passkey = None
            if args.passkey:
                lengths = [int(n) for n in args.passkey.split(",")]
                found = evaluate_passkey(teacher, tokenizer, lengths, trials=10, progress=False)
                passkey = {"accuracy": found["accuracy"], "key_tokens": {k: round(v, 3) for k, v in found["key_tokens"].items()}}
            copy = {f"gap{gap}": copy_scores(teacher, trials) for gap, trials in copy_sets.items()} or None
        whole = None
        if converted is not None:  # every other layer: the converted model's own block
            for i, layer in enumerate(teacher.model.layers):
                if i not in layers:
                    layer.self_attn = BlockAsAttention(converted.model.layers[i].mixer)
            with torch.no_grad():
                whole = evaluate_lambada(teacher, tokenizer, texts, progress=False)
        for i, layer in enumerate(teacher.model.layers):
            layer.self_attn = attentions[i]
        row = {"layers": args.layers, "variant": variant, "steps": args.steps, "lr": args.lr,
               **({"train_seqs": args.train_seqs} if args.train_seqs != TRAIN_SEQS else {}),
               **({"copy_frac": args.copy_frac} if args.copy_frac else {}),
               "lambada": {k: result[k] for k in ("accuracy", "perplexity", "n")}, "mse": mse,
               **({"passkey": passkey} if passkey else {}),
               **({"copy": copy} if copy else {}),
               **({"into": args.into, "lambada_whole": {k: whole[k] for k in ("accuracy", "perplexity", "n")}} if whole else {}),
               "seconds": round(time.time() - start, 1)}
        print(json.dumps(row), flush=True)
        with open(HERE / "recall_probe.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
