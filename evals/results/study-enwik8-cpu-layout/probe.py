"""Harmonic in Mamba's layout: is the study's remaining gap to Mamba the mixer or the layer layout?

The study compares Harmonic in the Llama layout the converter ships (4 x [norm, mixer, norm, MLP])
against transformers' Mamba in its own (8 x [norm, mixer], expand 2, a SiLU output gate z, no MLP).
`../study-enwik8-cpu-gap` put Mamba's mixer in the Llama layout (valid @256 2.531 -> 2.655); this
probe does the reverse: 8 Harmonic mixers, no MLP, a value stream expand x the hidden size, and an
output gate, the hidden size fitted to the study's parameter count. Everything else (data, order,
steps, optimizer, scoring) is `hallamonic study study-enwik8-cpu`'s protocol via its own `train_one`.

    python evals/results/study-enwik8-cpu-layout/probe.py VARIANT CONTEXT SEED [--out outputs/layout]

VARIANT: NAME[,levels=L][,expand=E][,gate_rank=R|none][,layers=K] (defaults: 3 levels, expand 2,
gate rank = hidden, 8 layers). Prints one line: variant, context, seed, params, valid and test bits.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from hallamonic.study.data import load_study_corpus
from hallamonic.study.models import Architecture, count_parameters, harmonic_config
from hallamonic.study.recipe import load_study_recipe
from hallamonic.study.runner import train_one


class NoMLP(nn.Module):
    """A layer's MLP branch that adds nothing (the residual stream passes through unchanged)."""

    def forward(self, x):
        return x.new_zeros(())


@dataclass
class MambaLayoutHarmonic(Architecture):
    def build(self, seed: int) -> nn.Module:
        model = super().build(seed)
        for layer in model.model.layers:  # [norm, mixer] only, as a Mamba block
            layer.mlp, layer.post_attention_layernorm = NoMLP(), nn.Identity()
        return model


def layout_config(shape, context: int, hidden: int, *, levels: int, expand: int, gate_rank, layers: int):
    config = harmonic_config(
        replace(shape, hidden_size=hidden, num_layers=layers, intermediate_size=8), 256, context,
        levels=levels, output_gate=gate_rank is not None,
    )
    config.head_dim = expand * hidden // shape.num_heads  # value stream / state width = expand x hidden
    if gate_rank is not None:
        config.output_gate_rank = hidden if gate_rank == "hidden" else int(gate_rank)
    return config


def count(config) -> int:
    """Parameters once the MLPs are gone (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        return sum(p.numel() for p in MambaLayoutHarmonic("x", config, 0).build(0).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant"), parser.add_argument("context", type=int), parser.add_argument("seed", type=int)
    parser.add_argument("--out", default="outputs/layout")
    args = parser.parse_args()
    name, *flags = args.variant.split(",")
    opts = {"levels": "3", "expand": "2", "gate_rank": "hidden", "layers": "8"} | dict(f.split("=") for f in flags)
    recipe = load_study_recipe("study-enwik8-cpu", [f"seed={args.seed}", f"contexts=[{args.context}]", "train.save_weights=false"])
    target = count_parameters(harmonic_config(recipe.model, 256, args.context))  # the study's harmonic row
    make = lambda h: layout_config(  # noqa: E731
        recipe.model, args.context, h, levels=int(opts["levels"]), expand=int(opts["expand"]),
        gate_rank=None if opts["gate_rank"] == "none" else opts["gate_rank"], layers=int(opts["layers"]),
    )
    hidden = min(range(64, 400, 4), key=lambda h: abs(count(make(h)) - target))
    config = make(hidden)
    arch = MambaLayoutHarmonic(name, config, count(config))
    corpus = load_study_corpus(recipe.data)
    out = Path(args.out) / f"{name}-s{args.seed}"
    done = out / "runs" / name / f"ctx-{args.context}" / "result.json"
    record = json.loads(done.read_text()) if done.is_file() else train_one(recipe, arch, args.context, corpus, out, resume=True)
    print(name, args.context, args.seed, f"hidden={hidden}", record["params"], record["valid_bits"], record["bits"], flush=True)


if __name__ == "__main__":
    main()
