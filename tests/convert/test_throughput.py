"""`hallamonic bench convert`: phase throughput through the pipeline's own phase runners."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hallamonic.cli import app
from hallamonic.convert.recipe import load_recipe
from hallamonic.convert.throughput import TEACHER_SHAPES, format_throughput, measure_throughput, random_teacher

FAST = ["phase1.seq_len=64", "phase2.seq_len=64", "phase1.batch_size=2", "phase2.batch_size=1"]


def test_both_phases_are_timed_and_extrapolated_to_the_recipe():
    recipe = load_recipe("tiny", FAST)
    result = measure_throughput(recipe, steps=2, warmup=1)
    assert [r["phase"] for r in result["phases"]] == ["phase1", "phase2"]
    for row, section in zip(result["phases"], (recipe.phase1, recipe.phase2)):
        assert row["timed_steps"] == 2  # the warm-up step is left out
        assert row["tokens_per_step"] == section.batch_size * section.seq_len
        assert row["tokens_per_s"] > 0
        assert row["recipe_tokens"] == section.steps * row["tokens_per_step"]
        assert row["estimated_hours"] == pytest.approx(row["recipe_tokens"] / row["tokens_per_s"] / 3600)
    table = format_throughput(result)
    assert "| phase1 |" in table and "| phase2 |" in table and "hours" in table


def test_focus_and_refit_are_timed_on_steady_steps_over_a_one_step_pool(monkeypatch):
    import hallamonic.convert.throughput as throughput

    pools = {}
    for name in ("run_phase1_focus", "run_phase2_refit"):  # record the pool each pooled phase was given
        real = getattr(throughput, name)

        def spy(run, teacher, *args, _real=real, _name=name):
            pools[_name] = (run.recipe.phase1.focus_pool, run.recipe.phase2.refit_pool)
            return _real(run, teacher, *args)

        monkeypatch.setattr(throughput, name, spy)
    recipe = load_recipe("tiny", FAST + ["phase1.focus_layers=[0]", "phase1.focus_steps=7", "phase2.refit_layers=[1]", "phase2.refit_steps=9"])
    result = measure_throughput(recipe, steps=2, warmup=0)
    rows = {r["phase"]: r for r in result["phases"]}
    assert list(rows) == ["phase1", "phase1-focus", "phase2", "phase2-refit"]
    assert pools == {"run_phase1_focus": (2, recipe.phase2.refit_pool), "run_phase2_refit": (recipe.phase1.focus_pool, 2)}  # one step's sequences
    for name, steps in (("phase1-focus", 7), ("phase2-refit", 9)):
        row = rows[name]
        assert row["pooled"] and row["timed_steps"] == 2  # the capture step is untimed even with warmup=0
        assert row["tokens_per_step"] == recipe.phase1.batch_size * recipe.phase1.seq_len
        assert row["recipe_steps"] == steps and row["recipe_tokens"] == steps * row["tokens_per_step"]
    assert rows["phase1"]["timed_steps"] == 2 and not rows["phase1"]["pooled"]
    table = format_throughput(result)
    assert "| phase1-focus |" in table and "| phase2-refit |" in table and "All 4 phases" in table
    assert "phase1-focus and phase2-refit: steps over a pool" in table


def test_random_teacher_has_the_named_shapes():
    teacher = random_teacher("smollm2-135m", torch.float32, torch.device("cpu"))
    config = teacher.config
    for key, value in TEACHER_SHAPES["smollm2-135m"].items():
        assert getattr(config, key) == value, key
    assert not any(p.requires_grad for p in teacher.parameters())
    with pytest.raises(ValueError, match="unknown teacher shape"):
        random_teacher("gpt-5", torch.float32, torch.device("cpu"))


def test_cli_prints_the_table_and_saves_json(tmp_path):
    path = tmp_path / "rates.json"
    result = CliRunner().invoke(app, ["bench", "convert", "tiny", "--steps", "1", "--warmup", "0", "--json", str(path)] + sum((["--set", s] for s in FAST), []))
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output
    assert [r["phase"] for r in json.loads(path.read_text())["phases"]] == ["phase1", "phase2"]


@pytest.mark.parametrize("args, message", [(["--teacher-shape", "gpt-5"], "unknown teacher shape"), (["--steps", "0"], "steps must be")])
def test_cli_rejects_bad_input(args, message):
    result = CliRunner().invoke(app, ["bench", "convert", "tiny"] + args)
    assert result.exit_code != 0
    assert message in result.output
