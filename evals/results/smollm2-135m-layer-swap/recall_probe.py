"""Does a normalised feature map recall better at equal training? Judge block variants by LAMBADA.

The transfer probe (`../smollm2-135m-transfer-probe`) ranked feature maps by phase 1's normalised
MSE only, and the identity map (plain linear attention over q.k) won. But the layer swaps showed the
mean MSE does not predict LAMBADA. This script builds FRESH blocks of each variant for LAYERS from
the teacher's attention (the block's own init, `init_from_attention`, the pipeline's calibration),
trains each on its layer's teacher attention I/O (phase 1's normalised MSE, AdamW, batch 4 x 512,
48 training sequences (--train-seqs) captured once), puts them into the teacher (softmax attention everywhere else)
and scores LAMBADA (first LIMIT passages of the shared dev file, lm-eval protocol).

Variants: those of `../smollm2-135m-transfer-probe/probe.py` (identity/none, elu/den, hedgehog/den,
identity/rms), with its block options after a third slash (e.g. identity/none/short_conv_size=4).

With --into CONVERTED_DIR each variant is also scored in that whole converted model: its own blocks
everywhere but LAYERS, the fresh ones there (the teacher with every layer swapped, as swap.py's "all").

Usage: python recall_probe.py LAYERS VARIANT [VARIANT ...] [--steps 180] [--lr 2e-3] [--limit 300] [--train-seqs 48] [--into DIR]
       [--passkey 256,1024]
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


def fresh_block(config, feature: str, normalise: str, teacher, layer: int, x_cal, y_cal, sink: bool = False) -> ProbeBlock:
    torch.manual_seed(layer)
    block = ProbeBlock(config, feature, normalise, layer, sink)
    for module in block.modules():  # the model's own init (gate timescales, zero up-projections)
        HallamonicPreTrainedModel._init_weights(types.SimpleNamespace(config=config), module)
    block.init_from_attention(teacher.model.layers[layer].self_attn)
    with torch.no_grad():  # the pipeline's calibration
        rms = block.value_stream(x_cal).float().pow(2).mean().sqrt().item()
        for norm in block.error_norms:
            norm.weight.fill_(rms)
        m = block(x_cal)[0].float()
        block.o_proj.weight.mul_((m * y_cal.float()).sum() / (m * m).sum())
    return block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers")
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--steps", type=int, default=180)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--train-seqs", type=int, default=TRAIN_SEQS, help="training sequences of 512 tokens, captured once")
    parser.add_argument("--passkey", default="", help="also score the hybrid's passkey at these lengths (comma list, 10 trials)")
    parser.add_argument("--into", help="a converted model folder: also score it with the fresh blocks in LAYERS")
    args = parser.parse_args()
    torch.set_num_threads(2)
    teacher, tokenizer = load_causal_lm(str(smollm2_gguf_path()))
    teacher.requires_grad_(False)
    layers = parse_layers(args.layers, len(teacher.model.layers))
    recipe, tokens, probe = conversion_data(tokenizer)
    train_io = capture(teacher, PackedBatches(tokens, 512, seed=0).sequences[: args.train_seqs], layers)
    held = capture(teacher, probe, layers)
    texts = lambada_texts(LAMBADA, args.limit)
    attentions = {i: layer.self_attn for i, layer in enumerate(teacher.model.layers)}
    converted = load_causal_lm(args.into)[0] if args.into else None
    for variant in args.variants:
        start = time.time()
        feature, normalise, harmonic, options = parse_variant(variant, recipe.harmonic)
        config = student_config(teacher, harmonic)
        blocks, mse = {}, {}
        for i in layers:
            x_all, y_all = train_io[i]
            blocks[i] = fresh_block(config, feature, normalise, teacher, i, x_all[:2], y_all[:2], options.get("sink") == "true")
            mse[i] = {"calibrated": normalised_mse(blocks[i], *held[i])}
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
               "lambada": {k: result[k] for k in ("accuracy", "perplexity", "n")}, "mse": mse,
               **({"passkey": passkey} if passkey else {}),
               **({"into": args.into, "lambada_whole": {k: whole[k] for k in ("accuracy", "perplexity", "n")}} if whole else {}),
               "seconds": round(time.time() - start, 1)}
        print(json.dumps(row), flush=True)
        with open(HERE / "recall_probe.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
