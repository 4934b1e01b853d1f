"""`hallamonic convert` end to end on the tiny recipe: export, resume, NaN guard, output folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import hallamonic.convert.pipeline as pipeline
from hallamonic.training.checkpoint import list_checkpoints
from hallamonic.convert.pipeline import OutputDirError, convert
from hallamonic.convert.recipe import load_recipe
from hallamonic.training.trainer import TrainingDiverged

FAST = ["phase1.steps=4", "phase2.steps=3", "checkpoint.every=2", "eval.max_windows=1", "eval.context_lengths=[128]"]
CLEAN_LOADER = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
ids = tok("Return the number of items", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=5, do_sample=False)
print(json.dumps({"logits": model(ids).logits[0, -1, :8].tolist(), "generated": out.shape[1] - ids.shape[1]}))
"""


def logged_losses(folder: Path, phase: str | None = None) -> list[float]:
    """The per-step losses a conversion logged in training/metrics.jsonl (one phase's, or all)."""
    rows = [json.loads(line) for line in (folder / "training" / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row.get("loss") is not None and phase in (None, row.get("phase"))]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny") / "out"
    report = convert(load_recipe("tiny", FAST), out)
    return out, report


def test_export_is_a_complete_checkpoint(converted):
    out, report = converted
    names = {p.name for p in out.iterdir()}
    for required in ("config.json", "model.safetensors", "modeling_hallamonic.py", "configuration_hallamonic.py",
                     "hallamonic_scan.py", "tokenizer.json", "generation_config.json", "README.md"):
        assert required in names, required
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_hallamonic.HallamonicForCausalLM"
    assert config["base_model_name_or_path"] == "builtin:tiny-llama"
    card = (out / "README.md").read_text()
    assert "phase1" in card and "Held-out bits per token" in card
    assert f"expanded, selective state: {config['head_dim']} numbers per channel per level" in card
    assert (out / "training" / "loss.png").stat().st_size > 1000
    assert [p["name"] for p in report["phases"]] == ["phase1", "phase2"]
    assert report["heldout"]["converted"]["bits_per_token"]["128"] > 0
    assert "selective_scan" in (out / "modeling_hallamonic.py").read_text()
    assert config["state_size"] == config["head_dim"]  # the expanded state, maps from the teacher's k/q
    # the tiny recipe's copy cache: attached after phase 2, its gate fitted, recorded, shipped
    assert "hallamonic_copy_cache.py" in names and config["copy_cache_orders"] == [1, 2, 3]
    assert report["copy_cache"]["nll_after"] <= report["copy_cache"]["nll_before"]
    assert "## Copy cache" in card and "repetition_penalty=1.2" in card
    assert report["copy_cache"]["fit_text"] == "unseen" and "tokens of text no phase trained on" in card
    assert (out / "training" / "tokens-copy-cache.npy").is_file()  # the fit's own stream, cached for --resume
    gate = load_file(out / "model.safetensors")["copy_cache.gate"]
    assert torch.allclose(gate, torch.tensor(report["copy_cache"]["gate"]), atol=1e-3)
    # and its context-word cue (copy_cache.seen), fitted after the n-gram gate, described in the card
    assert config["copy_cache_seen"] and "With the context-word cue" in card
    seen_gate = load_file(out / "model.safetensors")["copy_cache.seen_gate"]
    assert torch.allclose(seen_gate, torch.tensor(report["copy_cache"]["seen_gate"]), atol=1e-3)
    assert report["copy_cache"]["nll_after"] <= report["copy_cache"]["nll_ngram_only"] + 1e-4
    # and its word-continuation term (copy_cache.continuation): a fifth gate column and the tokenizer's table, saved
    assert config["copy_cache_continuation"] and all(len(row) == 5 for row in report["copy_cache"]["gate"])
    table = load_file(out / "model.safetensors")["copy_cache.continues_word"]
    assert table.dtype == torch.bool and table.shape == (config["vocab_size"],) and 0 < int(table.sum()) < len(table)
    assert "continues a word" in card
    # and the cue's prior (copy_cache.prior), rate (copy_cache.rate) and cap: two more cue numbers and the training
    # streams' log unigram frequencies
    assert config["copy_cache_prior"] and config["copy_cache_rate"] and len(report["copy_cache"]["seen_gate"]) == 6
    assert config["copy_cache_count_cap"] == 16 and "(at most 16)" in card and "log of the tokens so far" in card
    prior = load_file(out / "model.safetensors")["copy_cache.log_prior"]
    assert prior.shape == (config["vocab_size"],) and torch.isfinite(prior).all() and float(prior.exp().sum()) == pytest.approx(1.0, abs=1e-4)
    assert "log unigram frequency" in card
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["repetition_penalty"] == 1.2  # the cache makes greedy decoding loop: generate counters it


def test_attention_transfer_is_measured_at_every_stage(converted):
    """Per-layer normalised MSE on held-out text after surgery, calibration, phase 1 and phase 2, in the
    report and the card; phase 1 lowers it; the card shows both models' greedy continuations."""
    out, report = converted
    transfer = report["attention_transfer"]
    assert "held-out" in transfer["sample"]
    stages = transfer["normalised_mse"]
    assert list(stages) == ["surgery", "calibrated", "phase1", "phase2"]
    layers = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    assert all(len(errors) == layers and all(e > 0 for e in errors) for errors in stages.values())
    mean = {stage: sum(errors) / len(errors) for stage, errors in stages.items()}
    # (the tiny random teacher's attention is near zero: calibration fitted on training text only
    # reaches ~1.0 on held-out text; the real numbers are SmolLM2's, in the README)
    assert mean["calibrated"] < 1.1 and mean["phase1"] < mean["surgery"]
    saved = json.loads((out / "training" / "report.json").read_text())
    assert saved["attention_transfer"]["normalised_mse"] == stages
    assert saved["precision"]["mixed_precision"] == "no" and saved["precision"]["phase1_teacher"] == "float32"  # the tiny recipe: auto, null
    card = (out / "README.md").read_text()
    assert "## Attention transfer" in card and f"{mean['phase1']:.3f}" in card
    assert "## Greedy continuation" in card and report["continuations"]["prompt"] in card
    assert set(report["continuations"]) == {"prompt", "teacher", "converted"}


def test_a_local_teacher_is_recorded_by_its_name_only(tmp_path):
    from hallamonic.tiny import load_builtin_teacher

    teacher_dir = tmp_path / "machine" / "specific" / "my-teacher"
    teacher_dir.mkdir(parents=True)
    recipe = load_recipe("tiny", FAST + [f"base.model={teacher_dir}", "eval.max_windows=0"])
    out = tmp_path / "out"
    convert(recipe, out, phases=("surgery",), load_teacher=lambda spec, dtype: load_builtin_teacher("builtin:tiny-llama", dtype))
    assert json.loads((out / "config.json").read_text())["base_model_name_or_path"] == "my-teacher"
    card = (out / "README.md").read_text()
    assert "base_model: my-teacher" in card and str(tmp_path) not in card


def test_checkpoint_loads_and_generates_without_the_package(converted, without_hallamonic):
    out, _ = converted
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", without_hallamonic(CLEAN_LOADER), str(out)], capture_output=True, text=True, env=env, timeout=300, check=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    ids = tok("Return the number of items", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model(ids).logits[0, -1, :8]
    torch.testing.assert_close(torch.tensor(loaded["logits"]), expected, atol=1e-5, rtol=1e-5)
    assert loaded["generated"] == 5


TOKENIZER_ONLY = """
import json, sys
from transformers import AutoTokenizer
plain = AutoTokenizer.from_pretrained(sys.argv[1])
sys.stdout.flush(); print("---", flush=True)
untrusted = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=False)
print(json.dumps([plain("Return the number of items").input_ids, untrusted("Return the number of items").input_ids]))
"""


def test_the_tokenizer_is_the_teachers_and_needs_no_remote_code(converted):
    """The exported tokenizer is the teacher's standard one: no AutoTokenizer entry in any auto_map,
    a transformers class in tokenizer_config.json. The plain call, with no stdin and without
    `trust_remote_code`, returns it (transformers 5 still asks about the *config*'s remote code
    first, then falls back); `trust_remote_code=False` returns it without asking."""
    out, _ = converted
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "auto_map" not in tokenizer_config
    assert "AutoTokenizer" not in json.loads((out / "config.json").read_text())["auto_map"]
    import transformers

    assert hasattr(transformers, tokenizer_config["tokenizer_class"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", TOKENIZER_ONLY, str(out)], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, env=env, timeout=120, check=True)  # fmt: skip
    plain, untrusted = json.loads(result.stdout.strip().splitlines()[-1])
    _, teacher_tokenizer = pipeline.load_base_model("builtin:tiny-llama")
    assert plain == untrusted == teacher_tokenizer("Return the number of items").input_ids
    assert "custom code" not in result.stdout.split("---", 1)[1]  # trust_remote_code=False never asks


def test_frozen_tensors_are_bit_identical_after_training(converted):
    out, _ = converted
    teacher, _ = pipeline.load_base_model("builtin:tiny-llama")
    student = load_file(out / "model.safetensors")
    for name, tensor in teacher.state_dict().items():
        if ".self_attn." in name or name not in student:
            continue
        assert torch.equal(student[name], tensor), name
    trained = [k for k in student if ".mixer." in k and "gates" in k and "up.weight" in k]
    assert trained and any(student[k].abs().sum() > 0 for k in trained)  # the mixers did train (zero-initialised)


def test_resume_after_a_crash_reaches_the_same_weights(converted, tmp_path, monkeypatch):
    reference, _ = converted
    real = pipeline.phase2_loss
    calls = {"n": 0}

    def crashing(*args, **kwargs):
        inner = real(*args, **kwargs)

        def loss_fn(module, batch):
            calls["n"] += 1
            if calls["n"] == 3:  # phase 2, third step: after the step-2 checkpoint
                raise KeyboardInterrupt
            return inner(module, batch)

        return loss_fn

    out = tmp_path / "out"
    monkeypatch.setattr(pipeline, "phase2_loss", crashing)
    with pytest.raises(KeyboardInterrupt):
        convert(load_recipe("tiny", FAST), out)
    assert [p.name for p in list_checkpoints(out / "training" / "checkpoints" / "phase2")] == ["step-000002"]
    monkeypatch.setattr(pipeline, "phase2_loss", real)
    convert(load_recipe("tiny", FAST), out, resume=True)
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_phase2_alone_starts_from_a_finished_phase1(converted, tmp_path):
    """`--phases phase2 --resume` in a folder holding another run's token cache and phase-1
    checkpoints (how evals/results/smollm2-135m-phase2-sweep compares phase-2 settings) restores
    that phase 1 and reaches the weights of the run that did both phases in one go."""
    reference, report = converted
    out = tmp_path / "out"
    (out / "training" / "checkpoints").mkdir(parents=True)
    shutil.copy(reference / "training" / "tokens.npy", out / "training" / "tokens.npy")
    shutil.copytree(reference / "training" / "checkpoints" / "phase1", out / "training" / "checkpoints" / "phase1")
    again = convert(load_recipe("tiny", FAST), out, phases=("phase2",), resume=True)
    assert [p["name"] for p in again["phases"]] == ["phase2"]
    transfer, expected = again["attention_transfer"]["normalised_mse"], report["attention_transfer"]["normalised_mse"]
    assert transfer["phase1"] == pytest.approx(expected["phase1"], rel=1e-5)
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real = pipeline.phase1_loss

    def poisoned(teacher, pool=False, layers=None):
        inner, step = real(teacher, pool=pool, layers=layers), {"n": 0}

        def loss_fn(module, batch):
            step["n"] += 1
            loss = inner(module, batch)
            return loss * float("nan") if step["n"] == 3 else loss

        return loss_fn

    monkeypatch.setattr(pipeline, "phase1_loss", poisoned)
    out = tmp_path / "out"
    with pytest.raises(TrainingDiverged, match=r"\[phase1\] step 3: loss nan .* not finite \(non-finite gradients in .*\); training stopped.*step-000002"):
        convert(load_recipe("tiny", FAST), out)
    kept = list_checkpoints(out / "training" / "checkpoints" / "phase1")
    assert [p.name for p in kept] == ["step-000002"]
    weights = load_file(kept[0] / "weights.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_existing_output_folder_is_refused(converted):
    out, _ = converted
    with pytest.raises(OutputDirError, match="already exists"):
        convert(load_recipe("tiny", FAST), out)


def test_cli_runs_with_two_processes(tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "hallamonic.cli", "convert", "tiny",
           "-o", str(out)] + [a for kv in FAST for a in ("--set", kv)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "training" / "report.json").read_text())
    assert report["processes"] == 2
    assert report["phases"][0]["tokens"] == 4 * 4 * 2 * 128  # steps x batch x processes x seq_len
    assert (out / "model.safetensors").is_file()


def test_gradient_accumulation_matches_a_larger_batch(tmp_path):
    """Phase 2's loss is a token mean, so 2 micro-batches of 1 equal one batch of 2 (same rows)."""
    common = ["phase1.steps=0", "phase2.steps=2", "phase2.kl_weight=0", "checkpoint.every=0", "eval.max_windows=0",
              "harmonic.calibrate_norms=false", "copy_cache.orders=[]"]  # the cache's L-BFGS fit would magnify float noise
    convert(load_recipe("tiny", common + ["phase2.batch_size=2", "train.grad_accum=1"]), tmp_path / "a")
    convert(load_recipe("tiny", common + ["phase2.batch_size=1", "train.grad_accum=2"]), tmp_path / "b")
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    changed = 0
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=2e-5, rtol=1e-4)
        changed += ".mixer." in key
    assert changed


def test_focus_trains_only_the_focus_layers_and_phase2_alone_restores_it(converted, tmp_path):
    """`phase1.focus_steps` runs a "phase1-focus" after phase 1 that moves the focus layers' blocks
    only; `--phases phase2 --resume` in a folder holding both finished phases restores both."""
    reference, _ = converted
    focus = FAST + ["phase1.focus_steps=3", "phase1.focus_layers=[1]", "phase1.focus_pool=2", "phase2.steps=0"]
    out = tmp_path / "focus"
    report = convert(load_recipe("tiny", focus), out)
    assert [p["name"] for p in report["phases"]] == ["phase1", "phase1-focus"]
    seq_len = load_recipe("tiny", focus).phase1.seq_len
    assert report["phases"][1]["seq_len"] == seq_len  # the card's row reads it from the phase itself
    assert f"| phase1-focus | 3 | {report['phases'][1]['tokens']:,} | {seq_len} |" in (out / "README.md").read_text()
    stages = report["attention_transfer"]["normalised_mse"]
    assert set(stages) >= {"phase1", "phase1-focus"}
    assert stages["phase1-focus"][0] == stages["phase1"][0]  # layer 0 untouched
    assert stages["phase1-focus"][1] != stages["phase1"][1]
    root = out / "training" / "checkpoints"
    before = load_file(list_checkpoints(root / "phase1")[-1] / "weights.safetensors")
    after = load_file(list_checkpoints(root / "phase1-focus")[-1] / "weights.safetensors")
    assert set(after) == {k for k in before if k.startswith("model.layers.1.mixer.")}
    assert any(not torch.equal(after[k], before[k]) for k in after)

    again_dir = tmp_path / "again"
    (again_dir / "training").mkdir(parents=True)
    shutil.copy(out / "training" / "tokens.npy", again_dir / "training" / "tokens.npy")
    shutil.copytree(root, again_dir / "training" / "checkpoints")
    again = convert(load_recipe("tiny", focus), again_dir, phases=("phase2",), resume=True)
    assert again["attention_transfer"]["normalised_mse"]["phase1-focus"] == pytest.approx(stages["phase1-focus"], rel=1e-5)


def test_focus_on_converted_inputs_runs_among_the_blocks_and_restores_the_teacher(tmp_path, monkeypatch):
    """`phase1.focus_inputs: converted` fits the focus blocks inside the teacher with the student's
    blocks in every other layer (their inputs are the converted model's), the teacher's own
    attention still in the focus layers (it supplies the targets); the teacher is whole afterwards,
    and the fit differs from the one on the teacher's own stream."""
    from hallamonic.convert.phases import BlockAsAttention

    seen = []
    transfer = pipeline._attention_transfer

    def spy(run, name, section, layers, teacher, **kwargs):
        if name == "phase1-focus":
            seen.append({i: layer.self_attn for i, layer in enumerate(teacher.model.layers)})
            seen.append(run.student)
            seen.append(teacher)
        return transfer(run, name, section, layers, teacher, **kwargs)

    monkeypatch.setattr(pipeline, "_attention_transfer", spy)
    focus = FAST + ["phase1.focus_steps=3", "phase1.focus_layers=[1]", "phase1.focus_pool=2", "phase2.steps=0"]
    weights = {}
    for inputs in ("converted", "teacher"):
        seen.clear()
        convert(load_recipe("tiny", focus + [f"phase1.focus_inputs={inputs}"]), tmp_path / inputs)
        attentions, student, teacher = seen
        swapped = {i for i, attention in attentions.items() if isinstance(attention, BlockAsAttention)}
        assert swapped == ({0} if inputs == "converted" else set())
        if inputs == "converted":
            assert attentions[0].block is student.model.layers[0].mixer
        assert not any(isinstance(layer.self_attn, BlockAsAttention) for layer in teacher.model.layers)  # restored
        last = list_checkpoints(tmp_path / inputs / "training" / "checkpoints" / "phase1-focus")[-1]
        weights[inputs] = load_file(last / "weights.safetensors")
    assert any(not torch.equal(weights["converted"][k], weights["teacher"][k]) for k in weights["teacher"])


def test_refit_trains_only_its_layers_after_phase2_and_resumes(tmp_path):
    """`phase2.refit_steps` runs a "phase2-refit" after phase 2 that moves the refit layers' blocks
    only -- even a layer phase 2 held frozen -- reports their error on the converted model's inputs
    before and after, and a resumed run restores it instead of training again."""
    refit = FAST + ["phase2.frozen_layers=[1]", "phase2.refit_steps=4", "phase2.refit_layers=[1]", "phase2.refit_pool=2",
                    "phase2.refit_lr=3e-3"]
    out = tmp_path / "refit"
    report = convert(load_recipe("tiny", refit), out)
    assert [p["name"] for p in report["phases"]] == ["phase1", "phase2", "phase2-refit"]
    root = out / "training" / "checkpoints"
    phase1 = load_file(list_checkpoints(root / "phase1")[-1] / "weights.safetensors")
    phase2 = load_file(list_checkpoints(root / "phase2")[-1] / "weights.safetensors")  # layer 1 frozen: not in it
    after = load_file(list_checkpoints(root / "phase2-refit")[-1] / "weights.safetensors")
    assert set(after) == {k for k in phase1 if k.startswith("model.layers.1.mixer.")}
    assert any(not torch.equal(after[k], phase1[k]) for k in after)
    exported = load_file(out / "model.safetensors")
    assert all(torch.equal(exported[k], after[k]) for k in after)
    assert all(torch.equal(exported[k], phase2[k]) for k in phase2)  # phase 2's layers as phase 2 left them
    losses = [json.loads(line) for line in (out / "training" / "metrics.jsonl").read_text().splitlines()]
    refit_losses = [r["loss"] for r in losses if r["phase"] == "phase2-refit"]
    assert len(refit_losses) == 4 and refit_losses[-1] < refit_losses[0]
    fit = report["refit"]
    assert fit["layers"] == [1] and len(fit["before"]) == len(fit["after"]) == 1
    assert fit["after"][0] != fit["before"][0]  # (held-out: 2 training sequences of a random tiny model need not generalise)
    assert "before and after `phase2-refit`: layer 1:" in (out / "README.md").read_text()
    stages = report["attention_transfer"]["normalised_mse"]  # measured after phase 2 and after the refit
    assert stages["phase2-refit"][0] == stages["phase2"][0] and stages["phase2-refit"][1] != stages["phase2"][1]

    again = convert(load_recipe("tiny", refit), out, resume=True)
    assert [p["seconds"] for p in again["phases"]] == [0.0, 0.0, 0.0]  # every phase restored, none retrained
    for first, restored in zip(report["phases"], again["phases"]):  # ...with the time and loss its run had
        assert 0 < restored["earlier_seconds"] <= first["seconds"]  # (stamped when its last checkpoint was written)
        assert restored["final_loss"] == pytest.approx(first["final_loss"])
    assert "before a resume" in (out / "README.md").read_text()
    assert again["refit"]["after"] == pytest.approx(fit["after"], rel=1e-5)


def test_phase2_frozen_layers_keep_their_phase1_mixers(tmp_path):
    """`phase2.frozen_layers`: those layers' mixers leave phase 2 exactly as phase 1 made them,
    while the other mixers go on training."""
    out = tmp_path / "frozen"
    convert(load_recipe("tiny", FAST + ["phase2.frozen_layers=[1]"]), out)
    phase1 = load_file(list_checkpoints(out / "training" / "checkpoints" / "phase1")[-1] / "weights.safetensors")
    exported = load_file(out / "model.safetensors")
    frozen = [k for k in phase1 if k.startswith("model.layers.1.mixer.")]
    trained = [k for k in phase1 if k.startswith("model.layers.0.mixer.")]
    assert frozen and trained
    assert all(torch.equal(exported[k], phase1[k]) for k in frozen)
    assert any(not torch.equal(exported[k], phase1[k]) for k in trained)


def test_phase1_teacher_dtype_trains_on_a_bfloat16_teacher_pass(converted, tmp_path, monkeypatch):
    """`phase1.teacher_dtype: bfloat16`: phase 1 regresses a bfloat16 copy of the teacher (the
    teacher itself, which the card and calibration use, stays float32), and its losses are the
    float32 run's to within that rounding."""
    reference, _ = converted
    seen, original = [], pipeline.phase1_loss

    def recording(teacher, **kwargs):
        seen.append(next(teacher.parameters()).dtype)
        return original(teacher, **kwargs)

    monkeypatch.setattr(pipeline, "phase1_loss", recording)
    out = tmp_path / "bf16"
    convert(load_recipe("tiny", FAST + ["phase1.teacher_dtype=bfloat16"]), out)
    assert seen == [torch.bfloat16]

    ours, theirs = logged_losses(out, "phase1"), logged_losses(reference, "phase1")
    assert ours and len(ours) == len(theirs)
    assert ours == pytest.approx(theirs, rel=0.05) and ours != theirs


def test_bf16_mixed_precision_on_cpu_keeps_fp32_weights_and_the_fp32_losses(converted, tmp_path):
    """`train.mixed_precision: bf16` runs every phase under CPU bf16 autocast: the weights (and so
    the export) stay float32, and the losses are the float32 run's to within bf16 rounding."""
    reference, _ = converted
    out = tmp_path / "mixed"
    convert(load_recipe("tiny", FAST + ["train.mixed_precision=bf16"]), out)
    weights = load_file(out / "model.safetensors")
    assert {t.dtype for name, t in weights.items() if name != "copy_cache.continues_word"} == {torch.float32}
    ours, theirs = logged_losses(out), logged_losses(reference)
    assert ours and len(ours) == len(theirs)
    assert ours == pytest.approx(theirs, rel=0.05) and ours != theirs


def test_phase2_hidden_alignment_distils_from_one_shared_bfloat16_teacher_copy(converted, tmp_path, monkeypatch):
    """`phase2.hidden_weight` with `phase2.teacher_dtype: bfloat16`: phase 2 gets the bfloat16 copy of
    the teacher phase 1 already made (one copy, not two), and the term shows in its losses."""
    reference, _ = converted
    seen, originals = {}, (pipeline.phase1_loss, pipeline.phase2_loss)

    def recording(name, original):
        def wrapped(teacher, *args, **kwargs):
            seen[name] = teacher
            return original(teacher, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(pipeline, "phase1_loss", recording("phase1", originals[0]))
    monkeypatch.setattr(pipeline, "phase2_loss", recording("phase2", originals[1]))
    out = tmp_path / "hidden"
    bf16 = ["phase1.teacher_dtype=bfloat16", "phase2.teacher_dtype=bfloat16", "phase2.hidden_weight=5.0"]
    convert(load_recipe("tiny", FAST + bf16), out)
    assert next(seen["phase2"].parameters()).dtype == torch.bfloat16
    assert seen["phase2"] is seen["phase1"]

    ours, theirs = logged_losses(out, "phase2"), logged_losses(reference, "phase2")
    assert len(ours) == len(theirs) == 3
    assert all(a > b for a, b in zip(ours, theirs))  # cross-entropy plus a positive alignment term


@pytest.mark.parametrize("native", [True, False])
def test_native_teacher_dtype_is_bfloat16_only_where_the_hardware_computes_it(monkeypatch, native):
    monkeypatch.setattr(pipeline, "native_bfloat16", lambda device_type: native)
    teacher = torch.nn.Linear(4, 4)
    used = pipeline.teacher_in_dtype(teacher, "native")
    assert next(used.parameters()).dtype == (torch.bfloat16 if native else torch.float32)
    assert (used is teacher) is not native  # a copy only when the dtype changes
    assert next(teacher.parameters()).dtype == torch.float32


def test_bfloat16_asked_by_name_where_it_is_emulated_is_warned_about(monkeypatch, tmp_path, capsys):
    """A recipe that names bf16 / bfloat16 on a CPU without AVX-512 BF16 gets a warning naming the
    keys before anything loads (emulated, it ran 4.4x slower than float32); `native` gets none."""

    class Loaded(Exception):
        pass

    def stop(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(pipeline, "native_bfloat16", lambda device_type: False)
    named = load_recipe("tiny", FAST + ["train.mixed_precision=bf16", "phase1.teacher_dtype=bfloat16"])
    with pytest.raises(Loaded):
        convert(named, tmp_path / "named", load_teacher=stop)
    assert "warning: train.mixed_precision, phase1.teacher_dtype ask(s) for bfloat16" in capsys.readouterr().out
    native = load_recipe("tiny", FAST + ["train.mixed_precision=native", "phase1.teacher_dtype=native"])
    with pytest.raises(Loaded):
        convert(native, tmp_path / "native", load_teacher=stop)
    assert "warning" not in capsys.readouterr().out
    monkeypatch.setattr(pipeline, "native_bfloat16", lambda device_type: True)
    assert pipeline.emulated_bfloat16_keys(named, "cpu") == []


def test_layers_outside_the_model_are_refused_before_the_folder_is_made(tmp_path):
    recipe = load_recipe("tiny", FAST + ["phase2.frozen_layers=[0, 7]"])
    with pytest.raises(ValueError, match=r"`phase2.frozen_layers`: the model has layers 0-1, got \[7\]"):
        convert(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    recipe = load_recipe("tiny", FAST + ["phase2.refit_steps=2", "phase2.refit_layers=[2]"])
    with pytest.raises(ValueError, match=r"`phase2.refit_layers`: the model has layers 0-1, got \[2\]"):
        convert(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    recipe = load_recipe("tiny", FAST + ["harmonic.hedgehog_layers=[1, 3]"])
    with pytest.raises(ValueError, match=r"`harmonic.hedgehog_layers`: the model has layers 0-1, got \[3\]"):
        convert(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    recipe = load_recipe("tiny", FAST + ["harmonic.recall_layers=[2]", "harmonic.recall_timescale_bands=[[1, 4096]]"])
    with pytest.raises(ValueError, match=r"`harmonic.recall_layers`: the model has layers 0-1, got \[2\]"):
        convert(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_focus_layers_outside_the_model_are_refused_before_the_folder_is_made(tmp_path):
    recipe = load_recipe("tiny", FAST + ["phase1.focus_steps=2", "phase1.focus_layers=[5]"])
    with pytest.raises(ValueError, match=r"`phase1.focus_layers`: the model has layers 0-1, got \[5\]"):
        convert(recipe, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_token_stream_covers_the_focus_and_refit_pools():
    """A focus or refit pool (or the copy cache's fit windows) larger than what phase 1 and 2 read
    still gets its sequences tokenized."""
    base = load_recipe("tiny", FAST)
    seq_len = base.phase1.seq_len
    plain = pipeline._tokens_needed(base, world=1)
    refit = load_recipe("tiny", FAST + ["phase2.refit_steps=2", "phase2.refit_layers=[1]", "phase2.refit_pool=500"])
    focus = load_recipe("tiny", FAST + ["phase1.focus_steps=2", "phase1.focus_layers=[1]", "phase1.focus_pool=400"])
    assert pipeline._tokens_needed(refit, world=1) >= 500 * seq_len > plain
    assert pipeline._tokens_needed(focus, world=1) >= 400 * seq_len > plain
    unused = load_recipe("tiny", FAST + ["phase2.refit_pool=500"])  # no refit steps: its pool is not read
    assert pipeline._tokens_needed(unused, world=1) == plain
    cache = load_recipe("tiny", FAST + ["copy_cache.fit_windows=300", "copy_cache.fit_text=phase2"])  # the fit reads phase-2 text too
    assert pipeline._tokens_needed(cache, world=1) >= 300 * cache.copy_cache.fit_length > plain
    unseen = load_recipe("tiny", FAST + ["copy_cache.fit_windows=300", "copy_cache.fit_text=unseen"])  # its own stream past these
    assert pipeline._tokens_needed(unseen, world=1) == plain
    no_cache = load_recipe("tiny", FAST + ["copy_cache.fit_windows=300", "copy_cache.orders=[]"])
    assert pipeline._tokens_needed(no_cache, world=1) <= plain


def test_a_separate_phase2_source_gets_its_own_stream_sized_for_phase2_and_the_refit():
    seq_len = load_recipe("tiny", FAST).phase1.seq_len
    split = load_recipe("tiny", FAST + ["phase2_data.path=edu.txt", "phase2.refit_steps=2", "phase2.refit_layers=[1]",
                                        "phase2.refit_pool=500", "phase1.focus_steps=2", "phase1.focus_layers=[1]",
                                        "phase1.focus_pool=400"])
    assert 400 * seq_len <= pipeline._tokens_needed(split, world=1, stream="transfer") < 500 * seq_len
    assert pipeline._tokens_needed(split, world=1, stream="phase2") >= 500 * seq_len


def test_phase2_and_the_refit_train_on_phase2_data_and_phase1_on_data(tmp_path, monkeypatch):
    """With `phase2_data.path` set, phase 1 reads the `data` stream and phase 2 and its refit read the
    other file's, each cached for --resume; a resumed run reads the caches back."""
    import numpy as np

    from hallamonic.tiny import stdlib_corpus

    other = tmp_path / "other.txt"
    other.write_text("\n\n".join(f"Zebra quartz {i} vexed the jolly kingfisher." for i in range(400)))
    seen = {}
    train = pipeline.ConversionRun.train

    def recording_train(self, name, section, module, trainable, loss_fn, stream, seed):
        seen[name] = np.asarray(stream).copy()
        return train(self, name, section, module, trainable, loss_fn, stream, seed)

    monkeypatch.setattr(pipeline.ConversionRun, "train", recording_train)
    overrides = FAST + [f"phase2_data.path={other}", "phase2.refit_steps=2", "phase2.refit_layers=[1]", "phase2.refit_pool=2"]
    out = tmp_path / "out"
    convert(load_recipe("tiny", overrides), out)
    transfer = np.load(out / "training" / "tokens.npy")
    phase2 = np.load(out / "training" / "tokens-phase2.npy")
    tokenizer = pipeline.load_base_model("builtin:tiny-llama")[1]
    assert "Zebra quartz" in tokenizer.decode(phase2[:200]) and "Zebra quartz" not in tokenizer.decode(transfer[:2000])
    assert stdlib_corpus()[0][:40] in tokenizer.decode(transfer[:2000])
    assert np.array_equal(seen["phase1"], transfer[: len(seen["phase1"])])
    assert np.array_equal(seen["phase2"], phase2)
    assert np.array_equal(seen["phase2-refit"], phase2[: len(seen["phase2-refit"])])
    (out / "training" / "tokens-phase2.npy").unlink()
    np.save(out / "training" / "tokens-phase2.npy", phase2[::-1].copy())  # a cache --resume must read, not rebuild
    shutil.rmtree(out / "training" / "checkpoints" / "phase2")
    seen.clear()
    convert(load_recipe("tiny", overrides), out, resume=True)
    assert np.array_equal(seen["phase2"], phase2[::-1])


def test_an_empty_phase2_source_is_named(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(pipeline.DataError, match=r"the `phase2_data` text has 0 tokens"):
        convert(load_recipe("tiny", FAST + [f"phase2_data.path={empty}"]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_text_file_with_nothing_held_out_says_so_and_probes_training_text(tmp_path, capsys):
    """A plain-text file with no blank lines is one document: the 2% held-out split is empty, and the
    run says why its attention-transfer probes read training text."""
    from hallamonic.tiny import stdlib_corpus

    data = tmp_path / "one-paragraph.txt"
    data.write_text(" ".join(doc.replace("\n", " ") for doc in stdlib_corpus()[:200]))
    report = convert(load_recipe("tiny", FAST + [f"data.path={data}"]), tmp_path / "out", phases=("surgery",))
    assert report["attention_transfer"]["sample"].endswith("training tokens")
    assert "held out 0 document(s), 0 tokens" in capsys.readouterr().out
    paragraphs = tmp_path / "paragraphs.txt"  # blank-line separated: documents to hold out, no note
    paragraphs.write_text("\n\n".join(doc.replace("\n\n", "\n") for doc in stdlib_corpus()[:400]))
    report = convert(load_recipe("tiny", FAST + [f"data.path={paragraphs}"]), tmp_path / "out2", phases=("surgery",))
    assert report["attention_transfer"]["sample"].endswith("held-out tokens")
    assert "held out" not in capsys.readouterr().out


def test_the_copy_cache_can_fit_on_text_no_phase_read(tmp_path):
    """copy_cache.fit_text unseen: the fit windows are `data` right after the transfer stream (what a
    longer stream would hold there), cached for --resume; a source with nothing past the stream falls
    back to the phase-2 text and says so."""
    import numpy as np

    from hallamonic.convert.data import tokenize_stream

    tokenizer = pipeline.load_base_model("builtin:tiny-llama")[1]
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Zebra quartz {i} vexed the jolly kingfisher." for i in range(3000)))
    recipe = load_recipe("tiny", FAST + [f"data.path={text}", "copy_cache.fit_text=unseen", "copy_cache.fit_windows=3",
                                         "copy_cache.fit_length=64"])
    out = tmp_path / "out"
    (out / "training").mkdir(parents=True)
    notes = []
    streams, fresh = pipeline._load_streams(recipe, tokenizer, out, 1, resume=True, notify=notes.append)
    seen = len(streams["transfer"])
    longer = tokenize_stream(tokenizer, recipe.data, seed=recipe.seed, max_tokens=seen + 3 * 64)
    assert set(fresh) == {"transfer", "copy_cache"}
    assert np.array_equal(streams["copy_cache"], longer[seen:]) and len(streams["copy_cache"]) == 3 * 64
    windows, used = pipeline._copy_cache_windows(recipe, streams, notify=notes.append)  # (3, 64): all of it, shuffled
    assert used == "unseen" and windows.shape == (3, 64) and sorted(windows.flatten().tolist()) == sorted(streams["copy_cache"].tolist())
    pipeline._save_streams(streams, fresh, out)
    again, fresh = pipeline._load_streams(recipe, tokenizer, out, 1, resume=True, notify=notes.append)
    assert fresh == {} and np.array_equal(again["copy_cache"], streams["copy_cache"]) and notes == []
    trained = streams["phase2"]  # fit_text phase2: windows cut from the text phase 2 trained on
    chunks = {tuple(trained[k * 64 : (k + 1) * 64].tolist()) for k in range(len(trained) // 64)}
    phase2_fit, used = pipeline._copy_cache_windows(
        load_recipe("tiny", FAST + [f"data.path={text}", "copy_cache.fit_text=phase2", "copy_cache.fit_length=64"]), streams)
    assert used == "phase2" and all(tuple(row) in chunks for row in phase2_fit.tolist())

    short = tmp_path / "short.txt"  # all of it fits in the transfer stream: nothing unseen is left
    short.write_text("\n\n".join(f"Otter basalt {i} calmed the weary heron." for i in range(40)))
    small = load_recipe("tiny", FAST + [f"data.path={short}", "copy_cache.fit_text=unseen", "copy_cache.fit_windows=2",
                                        "copy_cache.fit_length=16"])
    streams, _ = pipeline._load_streams(small, tokenizer, tmp_path / "none", 1, resume=False, notify=notes.append)
    assert len(streams["copy_cache"]) == 0
    windows, used = pipeline._copy_cache_windows(small, streams, notify=notes.append)
    assert used == "phase2" and windows.shape == (2, 16) and "fitted on the phase-2 text instead" in notes[-1]


def test_resume_tokenizes_again_when_the_text_or_the_length_it_needs_changed(tmp_path):
    """The token caches carry what they were made from: --resume reads one only for the same source
    and when it holds what the recipe now needs, and says why when it tokenizes again. A cache with
    no sidecar (older runs, copied by hand) is read as before."""
    import numpy as np

    tokenizer = pipeline.load_base_model("builtin:tiny-llama")[1]
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Zebra quartz {i} vexed the jolly kingfisher." for i in range(3000)))
    fit_on_phase2 = "copy_cache.fit_text=phase2"  # no third stream: this test is about the two training streams
    recipe = load_recipe("tiny", FAST + [f"data.path={text}", fit_on_phase2])
    out = tmp_path / "out"
    (out / "training").mkdir(parents=True)
    notes = []

    def load(recipe):
        streams, fresh = pipeline._load_streams(recipe, tokenizer, out, 1, resume=True, notify=notes.append)
        pipeline._save_streams(streams, fresh, out)
        return streams["transfer"], fresh

    first, fresh = load(recipe)  # nothing cached yet
    assert set(fresh) == {"transfer"} and not fresh["transfer"]["exhausted"]
    assert json.loads((out / "training" / "tokens.json").read_text())["tokens"] == len(first)

    again, fresh = load(recipe)  # same source, same length: read back
    assert fresh == {} and notes == [] and np.array_equal(again, first)

    longer = load_recipe("tiny", FAST + [f"data.path={text}", "phase1.steps=40", fit_on_phase2])
    extended, fresh = load(longer)  # more steps than the cache holds
    assert set(fresh) == {"transfer"} and "the recipe now needs" in notes[-1]
    assert len(extended) > len(first) and np.array_equal(extended[: len(first)], first)

    text.write_text("\n\n".join(f"Otter basalt {i} calmed the weary heron." for i in range(3000)))
    other, fresh = load(longer)  # the file changed under the same path
    assert set(fresh) == {"transfer"} and "text source changed" in notes[-1]
    assert "Otter basalt" in tokenizer.decode(other[:50])

    (out / "training" / "tokens.json").unlink()  # an older run's cache: read as before
    count = len(notes)
    kept, fresh = load(longer)
    assert fresh == {} and len(notes) == count and np.array_equal(kept, other)
