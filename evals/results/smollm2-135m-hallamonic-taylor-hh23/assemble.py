"""Assemble the phase-1 and focus checkpoints of a conversion with Taylor blocks in 20, 21, 22, 24
and the recipe's Hedgehog block in 23, from two finished runs, so only phase 2 and the refit rerun.

Why this is sound: phase 1 and the focus train each block alone on its own layer's teacher
attention I/O (the teacher's residual stream, the same seed, data and order in both runs), so a
block's fit does not depend on the other layers' blocks (up to the shared gradient-norm clip of the
focus's joint step). Layer 23 comes from the recipe's seed-0 run (Hedgehog), every other layer from
the Taylor run.

Usage (repository root): python evals/results/smollm2-135m-hallamonic-taylor-hh23/assemble.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from hallamonic.training.checkpoint import latest_checkpoint

TAYLOR = Path("outputs/smollm2-taylor20/training")
RECIPE = Path("outputs/smollm2-mixed-levels/training")
OUT = Path("outputs/taylor-hh23/training")
FROM_RECIPE = "model.layers.23."


def main() -> None:
    (OUT / "checkpoints").mkdir(parents=True, exist_ok=True)
    for name in ("tokens.npy", "tokens-phase2.npy"):
        shutil.copy(TAYLOR / name, OUT / name)
    for phase in ("phase1", "phase1-focus"):
        taylor, recipe = latest_checkpoint(TAYLOR / "checkpoints" / phase), latest_checkpoint(RECIPE / "checkpoints" / phase)
        merged = {k: v for k, v in load_file(taylor / "weights.safetensors").items() if not k.startswith(FROM_RECIPE)}
        merged |= {k: v for k, v in load_file(recipe / "weights.safetensors").items() if k.startswith(FROM_RECIPE)}
        target = OUT / "checkpoints" / phase / taylor.name
        target.mkdir(parents=True, exist_ok=True)
        save_file(merged, target / "weights.safetensors")
        shutil.copy(taylor / "state.json", target / "state.json")  # marks the phase complete
        print(f"{phase}: {len(merged)} tensors -> {target}")


if __name__ == "__main__":
    main()
