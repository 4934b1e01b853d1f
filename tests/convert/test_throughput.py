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
