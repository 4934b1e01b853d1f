"""`hallamonic eval`: one-line errors with exit code 2, and a full run that writes its files."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from hallamonic.evaluation.cli import eval_command, parse_lengths


@pytest.fixture(scope="module")
def app():
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("eval")(eval_command)
    app.command("noop")(lambda: None)  # two commands, so `eval` is a subcommand as in hallamonic
    return app


def invoke(app, *args):
    return CliRunner().invoke(app, ["eval", *map(str, args)])


def test_parse_lengths():
    assert parse_lengths("1024, 4k,8K") == [1024, 4096, 8192]
    for bad in ("0", "-3", "1.5", "abc", "1024,,2"):
        with pytest.raises(typer.BadParameter):
            parse_lengths(bad)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope"], "nope"),
        (["--task", "context", "--context-lengths", "512,-1"], "-1"),
        (["--task", "lambada", "--data", "/does/not/exist.jsonl"], "not found"),
        (["--task", "lambada", "--baseline", "rope"], "unknown baseline"),
    ],
)
def test_bad_flags_exit_2(app, checkpoint, args, message):
    result = invoke(app, checkpoint, *args)
    assert result.exit_code == 2 and message in result.output


def test_bad_data_and_bad_model_are_one_line_errors(app, checkpoint, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"passage": "no text field"}\n')
    result = invoke(app, checkpoint, "--task", "lambada", "--data", bad)
    assert result.exit_code == 2 and "no `text` field" in result.output
    result = invoke(app, tmp_path / "missing-model", "--task", "passkey")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_debug_flag_raises_the_error_instead_of_one_line(app, tmp_path):
    result = invoke(app, tmp_path / "missing-model", "--task", "passkey", "--debug")
    assert result.exit_code != 0 and isinstance(result.exception, (FileNotFoundError, OSError, ValueError))
    assert "does not exist" in str(result.exception)


def test_lambada_run_prints_a_table_and_writes_results(app, checkpoint, lambada_file, tmp_path):
    out = tmp_path / "out"
    args = ["--task", "lambada", "--data", lambada_file, "--limit", 5, "--output-dir", out, "--no-progress"]
    result = invoke(app, checkpoint, *args)
    assert result.exit_code == 0, result.output
    assert "| teacher |" in result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["task"] == "lambada" and saved["n"] == 5 and set(saved) >= {"accuracy", "perplexity"}


def test_context_run_with_baseline_writes_plot(app, checkpoint, tmp_path):
    out = tmp_path / "ctx"
    args = ["--task", "context", "--data", tmp_path / "t.txt", "--context-lengths", "32,128", "--limit", 1]
    (tmp_path / "t.txt").write_text("The sea was calm and the boats came home. " * 60)
    result = invoke(app, checkpoint, *args, "--baseline", "ntk", "--output-dir", out, "--no-progress")
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert set(saved) == {"teacher", "teacher+ntk"} and set(saved["teacher"]["bits_per_token"]) == {"32", "128"}
    assert (out / "context.png").is_file()


def test_device_auto_is_the_gpu_when_there_is_one(monkeypatch):
    import torch

    from hallamonic.evaluation.cli import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"  # explicit choices stand
