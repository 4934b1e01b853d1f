"""Injected faults: SIGKILL of a real conversion, corrupted or incomplete model folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hallamonic.cli import app

SETTINGS = ["phase1.steps=30", "phase2.steps=0", "checkpoint.every=5", "checkpoint.keep=10", "eval.max_windows=0",
            "train.log_every=1"]


def convert_cmd(out: Path, *extra: str) -> list[str]:
    args = [a for kv in SETTINGS for a in ("--set", kv)]
    return [sys.executable, "-m", "hallamonic.cli", "convert", "tiny", "-o", str(out), *args, *extra]


def test_sigkill_mid_phase_then_resume_equals_an_uninterrupted_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    reference = tmp_path / "reference"
    subprocess.run(convert_cmd(reference), check=True, capture_output=True, env=env, timeout=600)

    out = tmp_path / "killed"
    process = subprocess.Popen(convert_cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    checkpoints = out / "training" / "checkpoints" / "phase1"
    deadline = time.time() + 300
    while time.time() < deadline and not (checkpoints / "step-000010").is_dir():
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # no exception handler runs: the process just vanishes
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (out / "model.safetensors").exists(), "the run finished before it could be killed"

    subprocess.run(convert_cmd(out, "--resume"), check=True, capture_output=True, env=env, timeout=600)
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bitwise on CPU


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from hallamonic.convert.pipeline import convert
    from hallamonic.convert.recipe import load_recipe

    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    convert(load_recipe("tiny", ["phase1.steps=1", "phase2.steps=0", "eval.max_windows=0"]), out)
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("training"))
    return dst


@pytest.mark.parametrize("damage", ["truncated weights", "garbage weights", "missing tokenizer"])
def test_damaged_model_folder_is_a_one_line_error_naming_the_file(tiny_checkpoint, tmp_path, damage):
    folder = _copy(tiny_checkpoint, tmp_path / "damaged")
    weights = folder / "model.safetensors"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage weights":
        weights.write_bytes(b"\x00\x01not a safetensors file" * 10)
    else:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    result = CliRunner().invoke(app, ["convert", "tiny", "-o", str(tmp_path / "out"), "--set", f"base.model={folder}"])
    assert result.exit_code == 2, result.output
    text = result.output
    assert "Traceback" not in text
    assert str(folder) in text or "tokenizer" in text.lower()
    assert not (tmp_path / "out").exists()  # nothing created for a run that could not start


def test_64k_tokens_stay_finite_in_fp32_and_bf16():
    from hallamonic.modeling import HallamonicConfig, HallamonicForCausalLM

    torch.manual_seed(0)
    config = HallamonicConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2)
    model = HallamonicForCausalLM(config).eval()
    with torch.no_grad():
        for gate in (layer.mixer.gates[-1] for layer in model.model.layers):
            gate.up.bias.fill_(-12.0)  # a ~ 1 - 6e-6: the slowest possible decay
        ids = torch.randint(0, 101, (1, 65536))
        for dtype in (torch.float32, torch.bfloat16):
            out = model.to(dtype)(ids, chunk_size=8192, logits_to_keep=4, use_cache=True)
            assert torch.isfinite(out.logits.float()).all()
            states = [layer.recurrent_states[0] for layer in out.cache.layers]
            assert all(torch.isfinite(s).all() and s.dtype == torch.float32 for s in states)


def test_disk_full_during_export_keeps_the_previous_export(tiny_checkpoint, tmp_path, monkeypatch):
    import errno
    import shutil as sh

    from hallamonic.convert import pipeline
    from hallamonic.convert.recipe import load_recipe

    out = tmp_path / "out"
    sh.copytree(tiny_checkpoint, out)
    before = (out / "model.safetensors").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    from transformers import PreTrainedTokenizerBase

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk)
    with pytest.raises(OSError, match="No space left"):
        pipeline.convert(load_recipe("tiny", ["phase1.steps=2", "phase2.steps=0", "eval.max_windows=0"]), out, resume=True)
    assert (out / "model.safetensors").read_bytes() == before  # the earlier export is untouched
    assert not [p for p in out.iterdir() if p.name.startswith(".export-")]  # no debris
