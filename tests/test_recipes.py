"""`hallamonic recipes`: conversion and study recipes listed and shown side by side."""

from __future__ import annotations

from typer.testing import CliRunner

from hallamonic.cli import app
from hallamonic.recipes import list_recipes, recipe_path

runner = CliRunner()


def run(*args: str):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def test_recipes_list_and_show():
    code, output = run("recipes", "list")
    assert code == 0 and "smollm2-135m" in output and "tinyllama-1.1b" in output and "study-enwik8-cpu" in output
    code, output = run("recipes", "show", "study-enwik8-28m")
    assert code == 0 and "# Cost -- measured on one H200" in output  # the header comments are shown
    code, output = run("recipes", "show", "tiny")
    assert code == 0 and "phase1:" in output and "#" in output
    code, output = run("recipes", "show", "tinyy")
    assert code == 2 and "did you mean `tiny`" in output


def test_both_kinds_are_listed_with_descriptions():
    recipes = list_recipes()
    assert {"tiny", "smollm2-135m", "tinyllama-1.1b"} <= set(recipes["conversion"])
    assert {"study-ci", "study-enwik8-cpu", "study-enwik8-28m"} <= set(recipes["study"])
    assert all(recipes[kind][name] for kind in recipes for name in recipes[kind])
    assert recipe_path("study-ci").parent.name == "study" and recipe_path("tiny").name == "tiny.yaml"
