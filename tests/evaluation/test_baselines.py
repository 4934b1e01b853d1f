"""NTK / YaRN baselines change RoPE only past the window, and runs carry them by name."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from hallamonic.evaluation.baselines import apply_rope_scaling, rope_scaling_parameters
from hallamonic.evaluation.runner import EvalOptions, run_evaluation
from hallamonic.evaluation.scoring import reset_dynamic_rope


def logits(model, ids):
    reset_dynamic_rope(model)
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("kind", ["ntk", "yarn"])
def test_rope_scaling_changes_logits_only_past_the_window(llama, kind):
    window = llama.config.max_position_embeddings  # 64
    scaled = copy.deepcopy(llama)
    params = apply_rope_scaling(scaled, kind, target_length=4 * window)
    assert scaled.config.rope_parameters["rope_type"] == params["rope_type"]
    short, long = torch.randint(3, 500, (1, window)), torch.randint(3, 500, (1, 3 * window))
    if kind == "ntk":  # dynamic NTK is the identity inside the window
        torch.testing.assert_close(logits(scaled, short), logits(llama, short))
    else:
        assert params["factor"] == 4.0 and params["original_max_position_embeddings"] == window
    assert not torch.allclose(logits(scaled, long)[:, window:], logits(llama, long)[:, window:], atol=1e-3)


def test_dynamic_ntk_state_does_not_leak_between_windows(llama):
    scaled = copy.deepcopy(llama)
    apply_rope_scaling(scaled, "ntk", target_length=256)
    short = torch.randint(3, 500, (1, 40))
    before = logits(scaled, short)
    logits(scaled, torch.randint(3, 500, (1, 200)))  # grows the cached frequencies
    scaled.model.rotary_emb.original_max_seq_len = 10**6  # transformers would then never reset
    torch.testing.assert_close(logits(scaled, short), before)


def test_refuses_non_rope_and_prescaled_models(llama):
    config = copy.deepcopy(llama.config)
    config.rope_parameters = {**config.rope_parameters, "rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="already scaled"):
        rope_scaling_parameters(config, "ntk", 128, 2.0)
    with pytest.raises(ValueError, match="unknown RoPE scaling"):
        rope_scaling_parameters(llama.config, "pi", 128, 2.0)


def test_run_with_all_baselines_names_each_model(checkpoint):
    options = EvalOptions(task="passkey", lengths=[48, 96], trials=2, progress=False)
    results = run_evaluation(str(checkpoint), options, baselines=["teacher", "ntk", "yarn", "ntk"])
    assert list(results) == ["teacher", "teacher+ntk", "teacher+yarn"]  # MODEL is the teacher
    assert results["teacher+yarn"]["rope_parameters"]["factor"] == 1.5  # 96 / window 64
    assert results["teacher"]["rope_window"] == 64 and not results["teacher"]["recurrent"]


def test_converted_checkpoint_finds_its_teacher_in_the_config(checkpoint, tmp_path):
    import shutil

    student = tmp_path / "student"
    shutil.copytree(checkpoint, student)
    config = json.loads((student / "config.json").read_text())
    (student / "config.json").write_text(json.dumps(config | {"base_model_name_or_path": str(checkpoint)}))
    options = EvalOptions(task="passkey", lengths=[48], trials=1, progress=False)
    results = run_evaluation(str(student), options, baselines=["teacher"])
    assert list(results) == ["student", "teacher"]
    assert results["teacher"]["model"] == str(checkpoint)


def test_a_teacher_recorded_by_name_only_needs_an_explicit_teacher(checkpoint, tmp_path):
    """A conversion records a local teacher by its folder name: baselines then take --teacher."""
    import shutil

    student = tmp_path / "student"
    shutil.copytree(checkpoint, student)
    config = json.loads((student / "config.json").read_text())
    (student / "config.json").write_text(json.dumps(config | {"base_model_name_or_path": checkpoint.name}))
    options = EvalOptions(task="passkey", lengths=[48], trials=1, progress=False)
    with pytest.raises(ValueError, match=f"teacher '{checkpoint.name}' recorded in the model's config .* pass --teacher PATH"):
        run_evaluation(str(student), options, baselines=["teacher"])
    results = run_evaluation(str(student), options, baselines=["teacher"], teacher=str(checkpoint))
    assert list(results) == ["student", "teacher"] and results["teacher"]["model"] == str(checkpoint)
