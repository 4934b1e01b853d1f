"""Checkpoints are atomic: a crash or a full disk mid-write never damages the previous one."""

from __future__ import annotations

import errno

import pytest
import torch

import hallamonic.training.checkpoint as checkpoint
from hallamonic.training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def make_optimizer(seed: float = 1.0):
    param = torch.nn.Parameter(torch.full((4, 3), seed))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones_like(param)
    optimizer.step()
    return param, optimizer


def test_round_trip_restores_weights_and_optimizer_state(tmp_path):
    param, optimizer = make_optimizer()
    save_checkpoint(tmp_path, 3, {"w": param}, optimizer, {"phase": "x", "complete": False})
    fresh_param, fresh_optimizer = make_optimizer(seed=5.0)
    weights, info = load_checkpoint(latest_checkpoint(tmp_path), fresh_optimizer)
    assert info["step"] == 3 and torch.equal(weights["w"], param.detach())
    a, b = optimizer.state_dict()["state"][0], fresh_optimizer.state_dict()["state"][0]
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(a[key], b[key]), key


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    param, optimizer = make_optimizer()
    for step in (2, 4, 6):
        save_checkpoint(tmp_path, step, {"w": param}, optimizer, {}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000004", "step-000006"]


def test_a_half_written_checkpoint_is_ignored(tmp_path):
    """What a SIGKILL during a write leaves behind: a temporary folder that resume never reads."""
    param, optimizer = make_optimizer()
    save_checkpoint(tmp_path, 2, {"w": param}, optimizer, {})
    partial = tmp_path / ".tmp-step-000004-abc"
    partial.mkdir()
    (partial / "weights.safetensors").write_bytes(b"\x00" * 10)
    assert latest_checkpoint(tmp_path).name == "step-000002"


@pytest.mark.parametrize("failure", ["crash", "disk full"])
def test_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch, failure):
    param, optimizer = make_optimizer()
    save_checkpoint(tmp_path, 2, {"w": param}, optimizer, {})
    real_save = checkpoint.save_file
    calls = {"n": 0}

    def failing_save(tensors, path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # weights written, optimizer state fails
            if failure == "disk full":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise KeyboardInterrupt
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", failing_save)
    expected = OSError if failure == "disk full" else KeyboardInterrupt
    with pytest.raises(expected):
        save_checkpoint(tmp_path, 4, {"w": param * 2}, optimizer, {})
    assert [p.name for p in tmp_path.iterdir()] == ["step-000002"]  # no debris, previous intact
    weights, _ = load_checkpoint(tmp_path / "step-000002")
    assert torch.equal(weights["w"], param.detach())
