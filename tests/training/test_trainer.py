"""The phase loop on a toy model: schedule, exact resume after a crash, NaN guard."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from hallamonic.training.packing import PackedBatches
from hallamonic.training.recipe import CheckpointSection, PhaseSection, TrainSection
from hallamonic.training.trainer import (
    MetricsLog, TrainingDiverged, learning_rate, make_accelerator, native_bfloat16, resolve_mixed_precision, run_phase,
)

SECTION = PhaseSection(steps=6, seq_len=8, batch_size=2, lr=0.05, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)


def loss_of(module, batch):
    return ((module(batch[:, :4].float() / 80) - batch[:, 4:5].float() / 80) ** 2).mean()


def train(tmp_path, loss_fn=loss_of, resume=False, on_nan="stop"):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    result = run_phase(
        name="toy", accelerator=make_accelerator("no"), module=model, trainable=dict(model.named_parameters()),
        loss_fn=loss_fn, batches=PackedBatches(np.arange(80, dtype=np.int32), 8, seed=0), section=SECTION,
        train=TrainSection(on_nan=on_nan, log_every=1), checkpointing=CheckpointSection(every=2, keep=1),
        checkpoint_root=tmp_path / "checkpoints", log=MetricsLog(tmp_path / "metrics.jsonl"), resume=resume,
    )  # fmt: skip
    return model, result


def test_schedule_warms_up_then_decays_to_the_floor():
    rates = [learning_rate(step, SECTION) for step in range(SECTION.steps)]
    assert rates[:2] == pytest.approx([0.025, 0.05])
    assert rates[2] == pytest.approx(0.05) and rates[-1] == pytest.approx(0.05 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75))))
    assert all(a >= b for a, b in zip(rates[1:], rates[2:]))
    constant = PhaseSection(steps=4, lr=0.1, warmup_steps=0, schedule="constant")
    assert [learning_rate(s, constant) for s in range(4)] == [0.1] * 4


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path):
    reference, result = train(tmp_path / "a")
    assert result.steps == 6 and result.final_loss is not None
    calls = {"n": 0}

    def crashing(module, batch):
        calls["n"] += 1
        if calls["n"] == 5:  # step 5, after the step-4 checkpoint
            raise KeyboardInterrupt
        return loss_of(module, batch)

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "b", crashing)
    resumed, result = train(tmp_path / "b", resume=True)
    assert result.resumed_from == 4
    for a, b in zip(reference.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_non_finite_loss_stops_or_skips(tmp_path):
    def nan_at_3(module, batch, calls={"n": 0}):  # noqa: B006 - a counter across calls
        calls["n"] += 1
        loss = loss_of(module, batch)
        return loss * float("nan") if calls["n"] == 3 else loss

    with pytest.raises(TrainingDiverged, match=r"\[toy\] step 3: loss nan .*training stopped.*step-000002"):
        train(tmp_path / "stop", nan_at_3)
    nan_at_3.__defaults__[0]["n"] = 0
    _, result = train(tmp_path / "skip", nan_at_3, on_nan="skip")
    rows = [json.loads(line) for line in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("skipped")] == [3] and result.final_loss is not None


def test_a_non_finite_gradient_names_its_parameters(tmp_path):
    """A finite loss whose gradient is NaN in the bias only: the message names the bias, not every
    parameter (clipping a NaN norm would write NaN into all of them)."""

    def nan_grad_in_bias(module, batch):  # 0 * sqrt(0) = 0 forward; 0 * inf = NaN backward, in the bias alone
        return loss_of(module, batch) + 0.0 * torch.sqrt(module.bias - module.bias.detach()).sum()

    with pytest.raises(TrainingDiverged, match=r"step 1: loss [0-9.]+ / gradient norm nan .*non-finite gradients in 1 of 2 parameters: bias\)"):
        train(tmp_path, nan_grad_in_bias)


def test_one_process_can_switch_mixed_precision():
    """Two conversions with different `train.mixed_precision` in one process (a notebook, this test
    run): accelerate's process-wide state would refuse the second precision; make_accelerator resets it."""
    assert str(make_accelerator("bf16").mixed_precision) == "bf16"
    assert str(make_accelerator("no").mixed_precision) == "no"
    assert str(make_accelerator("bf16").mixed_precision) == "bf16"
    assert str(make_accelerator("no").mixed_precision) == "no"


@pytest.mark.parametrize("native", [True, False])
def test_native_precision_is_bf16_only_where_the_hardware_computes_it(monkeypatch, native):
    """`native`: bf16 autocast on a CPU with AVX-512 BF16 (or AMX), none on one that would emulate
    it (4.4x slower than float32 there); `auto` stays what it was (none on CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert native_bfloat16("cpu") is native
    assert resolve_mixed_precision("native") == ("bf16" if native else "no")
    assert str(make_accelerator("native").mixed_precision) == ("bf16" if native else "no")
    assert resolve_mixed_precision("auto") == "no"
    assert resolve_mixed_precision("bf16") == "bf16"
