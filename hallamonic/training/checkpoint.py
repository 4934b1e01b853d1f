"""Atomic, pickle-free training checkpoints.

A checkpoint is a folder ``step-000050/`` holding the trainable weights and the optimizer state as
safetensors plus a small JSON. It is written to a temporary sibling and renamed into place, so a
crash (even SIGKILL) mid-write leaves the previous checkpoint intact and never a half one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STEP_PREFIX = "step-"


def _step_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step:06d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (temporary folders are ignored)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX):]))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors = {}
    scalars: dict[str, dict] = {}
    for index, param_state in state["state"].items():
        for key, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def save_checkpoint(
    root: Path,
    step: int,
    weights: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    info: dict,
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep`` ones."""
    root.mkdir(parents=True, exist_ok=True)
    final = _step_dir(root, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, tmp / "weights.safetensors")
        tensors, meta = _optimizer_tensors(optimizer)
        save_file(tensors, tmp / "optimizer.safetensors")
        (tmp / "state.json").write_text(json.dumps({"step": step, "optimizer": meta, **info}, indent=1))
        for f in tmp.iterdir():  # data on disk before the rename makes it visible
            with open(f, "rb") as handle:
                os.fsync(handle.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Weights and info of a checkpoint; restores ``optimizer`` in place when given."""
    info = json.loads((path / "state.json").read_text())
    weights = load_file(path / "weights.safetensors")
    if optimizer is not None:
        tensors = load_file(path / "optimizer.safetensors")
        meta = info["optimizer"]
        state: dict[int, dict] = {}
        for key, value in tensors.items():
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
        for index, values in meta["scalars"].items():
            state.setdefault(int(index), {}).update(values)
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return weights, info
