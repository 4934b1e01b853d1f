"""How far is a converted model's residual stream from its teacher's? Per layer, the per-token
normalised distance phase 2's `hidden_weight` term trains on (`hallamonic.convert.phases.hidden_alignment`),
on the last 1,024 tokens of the conversion's token cache, the teacher float32.

A folder followed by ``@phase1-focus`` (or ``@phase1``) is scored as it stood after that phase,
rebuilt from its checkpoints as ``../smollm2-135m-layer-swap/phase_states.py`` does.

Usage: python hidden_distance.py CONVERTED_DIR[@PHASE] [...]   (run from the repository root)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from hallamonic.convert.phases import LayerOutputs, hidden_alignment
from hallamonic.loading import load_causal_lm, smollm2_gguf_path

sys.path.insert(0, str(Path(__file__).parent.parent / "smollm2-135m-layer-swap"))
from phase_states import load_phase  # noqa: E402

STATES = {"": [], "phase1": ["phase1"], "phase1-focus": ["phase1", "phase1-focus"]}  # checkpoints restored per @phase


@torch.no_grad()
def layer_outputs(model, ids: torch.Tensor) -> list[torch.Tensor]:
    with LayerOutputs(model.model.layers) as states:
        model.model(input_ids=ids, use_cache=False)
    return states.tensors()


def main() -> None:
    torch.set_num_threads(2)
    teacher, _ = load_causal_lm(str(smollm2_gguf_path()))
    teacher_states: dict[bytes, list[torch.Tensor]] = {}  # one teacher pass per distinct token window
    for spec in sys.argv[1:]:
        folder, _, phase = spec.partition("@")
        tokens = np.load(Path(folder) / "training" / "tokens.npy")
        ids = torch.from_numpy(tokens[-1024:].astype(np.int64))[None]  # (1, 1024)
        student, _ = load_causal_lm(folder)
        checkpoints = Path(folder) / "training" / "checkpoints"
        if phase not in STATES:
            raise SystemExit(f"{spec}: the phase after @ must be one of {sorted(k for k in STATES if k)}")
        for earlier in STATES[phase]:
            load_phase(student, checkpoints, earlier)
        key = ids.numpy().tobytes()
        if key not in teacher_states:
            teacher_states[key] = layer_outputs(teacher, ids)
        per_layer = [hidden_alignment([s], [t]).item() for s, t in zip(layer_outputs(student, ids), teacher_states[key])]
        print(f"{spec}: mean {np.mean(per_layer):.3f}; per layer " + " ".join(f"{d:.3f}" for d in per_layer))


if __name__ == "__main__":
    main()
