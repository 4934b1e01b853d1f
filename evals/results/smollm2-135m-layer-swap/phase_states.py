"""Does phase 2 keep the recall the attention transfer built? Score LAMBADA on a conversion's model
as it stood after each phase, rebuilt from its checkpoints.

Phase 1 and phase1-focus train only the mixers, and their checkpoints hold exactly the trained
tensors, so the model at the end of phase 1 is the converted model with every mixer loaded from
phase 1's last checkpoint, and at the end of phase1-focus that plus the focus layers from its last
checkpoint. The converted model itself is the end of phase 2, or of its refit when it had one (then
the end of phase 2 is the focus state plus phase 2's checkpoint: phase 2 does not train the refit layer).

Usage: python phase_states.py CONVERTED_DIR [--limit 300]  (one line per state to phase_states.jsonl)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from hallamonic.evaluation.data import lambada_texts
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.loading import load_causal_lm
from hallamonic.training.checkpoint import latest_checkpoint
from swap import HERE, LAMBADA


def load_phase(model, checkpoints: Path, phase: str) -> int:
    """Copy the tensors of PHASE's last checkpoint into the model; returns how many."""
    weights = load_file(str(latest_checkpoint(checkpoints / phase) / "weights.safetensors"))
    missing = set(weights) - set(model.state_dict())
    if missing:
        raise SystemExit(f"{phase}: checkpoint tensors the model lacks: {sorted(missing)[:3]}")
    model.load_state_dict(weights, strict=False)
    return len(weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("converted")
    parser.add_argument("--limit", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(2)
    texts = lambada_texts(LAMBADA, args.limit)
    checkpoints = Path(args.converted) / "training" / "checkpoints"
    states = [("end of phase 2 (the converted model)", []), ("end of phase 1", ["phase1"]),
              ("end of phase1-focus", ["phase1", "phase1-focus"])]
    if (checkpoints / "phase2-refit").is_dir():  # the converted model is the refit's end; phase 2's end is before it
        states[0] = ("end of phase2-refit (the converted model)", [])
        states.append(("end of phase 2, before the refit", ["phase1", "phase1-focus", "phase2"]))
    for name, phases in states:
        start = time.time()
        model, tokenizer = load_causal_lm(args.converted)
        loaded = {phase: load_phase(model, checkpoints, phase) for phase in phases}
        with torch.no_grad():
            result = evaluate_lambada(model, tokenizer, texts, progress=False)
        row = {"converted": args.converted, "state": name, "tensors_loaded": loaded,
               "lambada": {k: result[k] for k in ("accuracy", "perplexity", "n")}, "seconds": round(time.time() - start, 1)}
        print(json.dumps(row), flush=True)
        with open(HERE / "phase_states.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
