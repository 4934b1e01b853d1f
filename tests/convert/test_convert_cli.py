"""`hallamonic convert`: bad input gets one clear line and a non-zero exit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hallamonic.cli import app

runner = CliRunner()
FAST = ["--set", "phase1.steps=1", "--set", "phase2.steps=1", "--set", "eval.max_windows=0"]


def run(*args: str):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "phase1.stepz=3"], "did you mean `phase1.steps`"),
        (["--set", "phase1.steps"], "--set expects key=value"),
        (["--set", "phase1.steps=-2"], "`phase1.steps` must be >= 0"),
        (["--phases", "surgery,phase3"], "unknown phase"),
        (["--set", "base.model=/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
        (["--set", "data.path=/nonexistent/corpus.jsonl"], "/nonexistent/corpus.jsonl does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    code, output = run("convert", "tiny", "-o", str(tmp_path / "out"), *args)
    assert code == 2, output
    assert message in output
    assert "Traceback" not in output


def test_wrong_data_field_and_tiny_data(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"content": "x"}) + "\n")
    code, output = run("convert", "tiny", "-o", str(tmp_path / "a"), "--set", f"data.path={data}", *FAST)
    assert code == 2 and "no `text` field" in output
    data.write_text(json.dumps({"text": "just a few words"}) + "\n")
    code, output = run("convert", "tiny", "-o", str(tmp_path / "b"), "--set", f"data.path={data}",
                       "--set", "data.heldout_fraction=0", *FAST)
    assert code == 2 and "fewer than one sequence" in output


def test_a_local_file_through_a_datasets_builder(tmp_path):
    """What a user without hub access can also write: `data.dataset=json` with `data.data_files`."""
    from hallamonic.tiny import stdlib_corpus

    data = tmp_path / "corpus.jsonl"
    data.write_text("\n".join(json.dumps({"text": doc}) for doc in stdlib_corpus()[:200]) + "\n")
    code, output = run("convert", "tiny", "-o", str(tmp_path / "out"), "--set", "data.dataset=json",
                       "--set", f"data.data_files={data}", *FAST)
    assert code == 0, output
    assert (tmp_path / "out" / "model.safetensors").is_file()
    recorded = (tmp_path / "out" / "training" / "recipe.yaml").read_text()
    assert "dataset: json" in recorded and str(data) in recorded


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from hallamonic.tiny import build_tiny_tokenizer

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=512)).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    code, output = run("convert", "tiny", "-o", str(tmp_path / "out"), "--set", f"base.model={folder}", *FAST)
    assert code == 2 and "cannot convert a `gpt2` model" in output


def test_existing_output_folder_needs_resume_or_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "something").write_text("keep me")
    code, output = run("convert", "tiny", "-o", str(out), *FAST)
    assert code == 2 and "--resume" in output and "--overwrite" in output
    assert (out / "something").read_text() == "keep me"


def test_debug_flag_shows_the_exception(tmp_path):
    from hallamonic.training.recipe import RecipeError

    result = runner.invoke(app, ["convert", "tiny", "-o", str(tmp_path / "out"), "--set", "phase1.stepz=3", "--debug"])
    assert result.exit_code != 0 and isinstance(result.exception, RecipeError)
